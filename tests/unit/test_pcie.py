"""Which GPU a port's HCA serves, from the PCIe tree (``agent.pcie``)."""

from __future__ import annotations

from pathlib import Path

from agent.pcie import nearest_gpus, pcie_path, sysfs_device


def test_the_gpu_sharing_the_most_bridges_is_served() -> None:
    hca = ("0000:15:01.0", "0000:16:00.0", "0000:17:10.0", "0000:19:00.0")
    gpus = {
        "0": ("0000:15:01.0", "0000:16:00.0", "0000:17:08.0", "0000:18:00.0"),  # the same switch
        "1": ("0000:15:01.0", "0000:1a:00.0"),  # the same root port only
        "2": ("0000:27:01.0", "0000:2a:00.0"),  # another root port
    }
    assert nearest_gpus(hca, gpus) == ["0"]
    twin = gpus["0"][:-1] + ("0000:18:01.0",)
    assert nearest_gpus(hca, gpus | {"3": twin}) == ["0", "3"]  # two GPUs on the switch: both
    assert nearest_gpus(hca, {"2": gpus["2"]}) == [] and nearest_gpus((), gpus) == []


def test_paths_and_bus_ids_in_every_spelling(tmp_path: Path) -> None:
    device = tmp_path / "devices" / "pci0000:15" / "0000:15:01.0" / "0000:18:00.0"
    device.mkdir(parents=True)
    (tmp_path / "link").symlink_to(device)
    assert pcie_path(tmp_path / "link") == ("0000:15:01.0", "0000:18:00.0")
    assert pcie_path(tmp_path / "missing") == ()
    assert sysfs_device(tmp_path, "00000000:18:00.0") == tmp_path / "0000:18:00.0"  # NVML's
    assert sysfs_device(tmp_path, "0000:3B:00") == tmp_path / "0000:3b:00.0"  # the kernel's
    assert sysfs_device(tmp_path, "not a bus id") is None
