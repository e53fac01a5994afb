"""The example Kubernetes Job for the bundled training job agrees with what Vigil does: the job's
checkpoint exit code restarts the pod without counting as a failure, and nothing in it tolerates
the taint Vigil puts on the nodes it quarantines. (Schema validation of every manifest comes with
the deploy tree.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from controller.act.kube.plans import TAINT_KEY
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE

EXAMPLE = Path(__file__).parents[2] / "deploy" / "training-job.example.yaml"


def test_the_checkpoint_exit_code_restarts_the_pod_and_quarantined_nodes_are_avoided() -> None:
    service, job = list(yaml.safe_load_all(EXAMPLE.read_text()))
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    spec = job["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    ignored = [
        r["onExitCodes"] for r in spec["podFailurePolicy"]["rules"] if r["action"] == "Ignore" and "onExitCodes" in r
    ]
    assert ignored == [{"containerName": container["name"], "operator": "In", "values": [CHECKPOINTED_EXIT_CODE]}]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    tolerated = [t.get("key") for t in spec["template"]["spec"].get("tolerations", [])]
    assert TAINT_KEY not in tolerated
    env = {e["name"]: e for e in container["env"]}
    assert {"RANK", "WORLD_SIZE", "MASTER_ADDR", "VIGIL_CONTROLLER", "VIGIL_NODE", "VIGIL_JOB_ID"} <= env.keys()
    assert env["VIGIL_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert int(env["WORLD_SIZE"]["value"]) == spec["completions"] == spec["parallelism"]
