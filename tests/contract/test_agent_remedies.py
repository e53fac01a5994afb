"""The agent's GPU and bus resets (``agent.remedies``) against a fake ``nvidia-smi`` acting on a
simulated node: the order NVIDIA documents (evidence, no process, persistence off, reset,
persistence back, present again), a refusal while a process holds the GPU, and failures said."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from agent.remedies import Remedies, RemediesConfig, same_gpu
from gpus.simulated import SimulatedBackend
from protos.vigil.v1 import agent_pb2, common_pb2

NODE = "node-1"


class Node:
    def __init__(self, tmp: Path) -> None:
        self.faults = tmp / "faults.jsonl"
        self.state = tmp / "smi.json"
        self.sysfs = tmp / "sys"
        self.kernel_log = tmp / "kmsg"
        self.backend = SimulatedBackend(NODE, 8, fault_file=self.faults)
        self.bus = [g.pci_bus_id for g in self.backend.gpus()]
        smi = (sys.executable, "-m", "tests.fakes.nvidia_smi", "--node", NODE, "--gpus", "8", "--faults",
               str(self.faults), "--state", str(self.state), "--sysfs", str(self.sysfs), "--")  # fmt: skip
        self.config = RemediesConfig(enabled=True, nvidia_smi=smi, pci_sysfs=self.sysfs)
        for bus in self.bus:
            (self.sysfs / f"{bus}.0").mkdir(parents=True)

    def behave(self, **state: object) -> None:
        self.state.write_text(json.dumps(state))

    def calls(self) -> list[list[str]]:
        path = Path(f"{self.state}.calls")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def remedy(self, remedy: str, gpus: list[int], enabled: bool = True) -> common_pb2.CheckResult:
        config = self.config.model_copy(update={"enabled": enabled})
        remedies = Remedies(NODE, config, lambda: self.bus, self.kernel_log)
        request = agent_pb2.RunRemedy(
            request_id="r1", remedy=remedy, pci_bus_ids=[self.bus[i] for i in gpus], deadline_s=60
        )
        return asyncio.run(remedies.run(request))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_a_gpu_reset_turns_persistence_off_resets_restores_it_and_the_gpu_is_healthy_again(node: Node) -> None:
    node.backend.set_faults(2, remap_pending=True, recovery_action=1)
    node.behave(persistence=[2])
    node.kernel_log.write_text("6,1,1,-;NVRM: Xid (PCI:0000:3a:00): 48, pid=0, double bit ECC\n6,2,2,-;eth0 up\n")
    result = node.remedy("gpu_reset", [2])
    assert result.verdict == common_pb2.OK, result.reason
    asked = [c for c in node.calls() if not c[0].startswith("--query") and c[0] != "-q"]
    bus = f"{node.bus[2]}.0"
    assert asked == [["-pm", "0", "-i", bus], ["-r", "-i", bus], ["-pm", "1", "-i", bus]]
    assert "NVSMI LOG" in result.evidence and "Xid (PCI:0000:3a:00): 48" in result.evidence
    assert "eth0" not in result.evidence  # only the driver's lines
    reading = node.backend.read(2)
    assert not reading.remap_pending and reading.recovery_action == 0
    assert json.loads(node.state.read_text())["persistence"] == [2]  # restored


def test_a_process_on_the_gpu_refuses_the_reset_and_nothing_is_touched(node: Node) -> None:
    node.backend.set_faults(2, remap_pending=True)
    node.behave(processes=[{"gpu": 2, "pid": 4242, "name": "python"}], persistence=[2])
    result = node.remedy("gpu_reset", [2])
    assert result.verdict == common_pb2.UNKNOWN and result.figures["busy"] == 1
    assert "pid 4242 (python)" in result.reason
    assert not [c for c in node.calls() if c[0] in ("-r", "-pm")]
    assert node.backend.read(2).remap_pending


def test_a_process_on_another_gpu_does_not_stop_the_reset(node: Node) -> None:
    node.behave(processes=[{"gpu": 5, "pid": 1, "name": "python"}])
    assert node.remedy("gpu_reset", [2]).verdict == common_pb2.OK


def test_a_reset_that_fails_is_said_and_persistence_mode_is_still_restored(node: Node) -> None:
    node.behave(persistence=[2], reset_fails=[2])
    result = node.remedy("gpu_reset", [2])
    assert result.verdict == common_pb2.FAIL and "exited 3" in result.reason and "did not complete" in result.reason
    assert ["-pm", "1", "-i", f"{node.bus[2]}.0"] in node.calls()
    assert json.loads(node.state.read_text())["persistence"] == [2]


def test_a_gpu_gone_after_its_reset_is_a_failure(node: Node) -> None:
    node.behave(gone_after_reset=[3])
    result = node.remedy("gpu_reset", [3])
    assert result.verdict == common_pb2.FAIL and "not listed by nvidia-smi after the reset" in result.reason


def test_a_bus_reset_asks_the_kernel_through_sysfs(node: Node) -> None:
    node.backend.set_faults(4, lost=True)
    result = node.remedy("bus_reset", [4])
    assert result.verdict == common_pb2.OK, result.reason
    assert (node.sysfs / f"{node.bus[4]}.0" / "reset_method").read_text() == "bus\n"
    assert not node.backend.read(4).lost


def test_remedies_off_or_unknown_are_unknown_and_run_nothing(node: Node) -> None:
    off = node.remedy("gpu_reset", [2], enabled=False)
    assert off.verdict == common_pb2.UNKNOWN and "off in this agent's configuration" in off.reason
    odd = node.remedy("reflash", [2])
    assert odd.verdict == common_pb2.UNKNOWN and "no remedy named 'reflash'" in odd.reason
    assert node.calls() == []


def test_bus_ids_are_compared_as_nvidia_smi_and_vigil_write_them() -> None:
    assert same_gpu("00000000:18:00.0", "0000:18:00")
    assert not same_gpu("00000000:18:00.0", "0000:2a:00")
    assert not same_gpu("garbage", "0000:18:00")


def test_vigil_remedy_resets_on_this_machine_and_says_its_result_by_exit_code_and_json(node: Node) -> None:
    import subprocess

    smi = " ".join(node.config.nvidia_smi)
    result = node.state.parent / "result.json"
    node.behave(processes=[{"gpu": 1, "pid": 77, "name": "python"}])
    args = [sys.executable, "-m", "vigil", "remedy", "gpu_reset", "--gpu", node.bus[1], "--nvidia-smi", smi,
            "--pci-sysfs", str(node.sysfs), "--result-file", str(result)]  # fmt: skip
    refused = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and json.loads(result.read_text())["busy"] is True
    node.behave(reset_fails=[1])
    failed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and json.loads(result.read_text())["verdict"] == "FAIL"
    node.behave()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(result.read_text())["reason"] == "1 GPU(s) reset and present again"
    bad = subprocess.run([*args[:4], "reflash"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no remedy named 'reflash'" in bad.stderr


def test_a_result_too_long_for_a_termination_message_cuts_the_evidence_first() -> None:
    from agent.remedies import result_json

    long = common_pb2.CheckResult(
        check="gpu_reset", verdict=common_pb2.OK, reason="done", evidence="x" * 20_000, finished_at=1.8e9
    )
    text = result_json(long)
    assert len(text.encode()) <= 4096 and json.loads(text)["reason"] == "done"
    assert json.loads(text)["finished_at"] == 1.8e9  # when the node finished it: later faults came after
    assert json.loads(text)["evidence"].endswith("[cut]")


def test_the_evidence_query_has_the_remedys_time_not_one_second(node: Node) -> None:
    """``nvidia-smi -q`` on a sick GPU takes a while: its evidence is kept (it was given 1 s, a
    duration passed where a deadline was meant, and lost on a loaded machine)."""
    node.behave(query_s=1.5)
    result = node.remedy("gpu_reset", [2])
    assert "NVSMI LOG" in result.evidence, result.evidence[:300]
