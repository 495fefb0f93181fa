"""An operator's drain and undrain of a real Slurm node (issue 17), through the connector's
step executor with steps as app/actions/messages.py builds them: ``scontrol update
NodeName=… State=DRAIN Reason=…`` then ``State=RESUME``, each read back by its confirm.
The job running there runs on, a job pinned there waits until the undrain, resends are
answered without harm and a stale drain is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connectors.actions import ConnectorStepExecutor
from tests.connectors.conftest import SlurmCluster
from wire.steps import Outcome, StepReport, StepRequest

NODE = "node3"


def _step(name: str, key: str, generation: int, **args: Any) -> StepRequest:
    return StepRequest(
        action_id=generation, key=key, step=name, workload_id=NODE, generation=generation, args=args
    )


def test_a_drained_slurm_node_keeps_its_job_and_takes_no_new_one(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    executor = ConnectorStepExecutor(slurm.connector(), cluster="hpc-test", state_dir=tmp_path)
    running = slurm.sbatch("-w", NODE)
    slurm.wait_state(running, "RUNNING")
    try:
        drained = executor.run(_step("drain", "d1", 5, reason="shaper test: bad DIMM"))
        assert drained.ok, drained.error
        shown = slurm.run("scontrol", "show", "node", NODE)
        assert "DRAIN" in shown and "Reason=shaper test: bad DIMM" in shown, shown

        def confirmed(expect: str, key: str, generation: int) -> StepReport:
            report = executor.run(_step("confirm", key, generation, expect=expect))
            return report if report.ok else None  # type: ignore[return-value]

        seen = slurm.wait_for("the drain read back", lambda: confirmed("drained", "c1", 5))
        assert seen.result["state"] == "draining", seen.result
        assert slurm.job(running)["state"] == "RUNNING"  # its job runs on
        waiting = slurm.sbatch("-w", NODE)
        held_back = slurm.wait_for(
            "the job pinned there to wait for the node",
            lambda: "ReqNodeNotAvail" in slurm.job(waiting)["reason"] and slurm.job(waiting),
        )
        assert held_back["state"] == "PENDING", held_back
        # A new drain of the drained node (another action) only rewrites its reason.
        assert executor.run(_step("drain", "d2", 6, reason="again")).ok
        assert executor.run(_step("drain", "d2", 6)).outcome is Outcome.duplicate

        assert executor.run(_step("undrain", "u1", 7)).ok
        up = slurm.wait_for("the undrain read back", lambda: confirmed("up", "c2", 7))
        assert up.result["state"] == "up"
        # The older drain, delivered late, is refused: the node stays in service.
        stale = executor.run(_step("drain", "d3", 6))
        assert stale.outcome is Outcome.refused, stale
        assert "DRAIN" not in slurm.run("sinfo", "-h", "-n", NODE, "-o", "%T").upper()
        # Undraining a node in service is nothing to do.
        assert executor.run(_step("undrain", "u2", 8)).ok
        slurm.run("scancel", running)
        slurm.wait_state(waiting, "RUNNING")
    finally:  # the session's other tests need the node (and its fixture waits for idle)
        if "DRAIN" in slurm.run("sinfo", "-h", "-n", NODE, "-o", "%T").upper():
            slurm.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
