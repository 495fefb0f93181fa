"""The executor hands a step's resume pointer to connectors that restart work themselves
(``SupportsResumePointer``) and not to others; the runner gives telemetry and the action
worker one connector. No scheduler is needed: the connectors here record what they are
asked (the Kubernetes and Kueue ones are tested on a real control plane in tests/k8s)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from connectors import registry, runner
from connectors.actions import ConnectorStepExecutor
from wire.steps import Outcome, StepRequest
from wire.telemetry import ClusterState, SchedulerKind


class Staging:
    """A scheduler whose restarted job finds its image where the agent staged it (Slurm)."""

    kind = SchedulerKind.slurm
    cluster = "k"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def read_state(self) -> ClusterState:
        return ClusterState(observed_at=datetime.now(UTC), nodes=[], jobs=[])

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        self.calls.append(("requeue", external_id, nodes, hold))

    def suspend(self, external_id: str) -> None:
        self.calls.append(("suspend", external_id))

    def resume(self, external_id: str) -> None:
        self.calls.append(("resume", external_id))


class Restarting(Staging):
    """A scheduler that restarts stopped work itself and must be told where it resumes."""

    kind = SchedulerKind.kubernetes

    def set_resume_pointer(self, external_id: str, resume_from: str | None) -> None:
        self.calls.append(("pointer", external_id, resume_from))


def step(name: str, **args: Any) -> StepRequest:
    return StepRequest(
        action_id=1, key=f"{name}:{sorted(args)}", step=name, workload_id="j", args=args
    )


IMAGE = {"image_dir": "/images/j/1", "backend": "signal", "size_bytes": 1}


def test_the_checkpoint_image_reaches_a_connector_that_restarts_the_work(tmp_path: Path) -> None:
    connector = Restarting()
    executor = ConnectorStepExecutor(connector, cluster="k", state_dir=tmp_path)

    report = executor.run(step("requeue", nodes=["n1"], hold=True, image=IMAGE))
    assert report.ok and report.result["resume_from"] == "/images/j/1"
    # An explicit pointer wins over the image's directory.
    assert executor.run(step("suspend", resume_from="s3://ckpt/j", image=IMAGE)).ok
    assert connector.calls == [
        ("pointer", "j", "/images/j/1"),
        ("requeue", "j", ["n1"], True),
        ("pointer", "j", "s3://ckpt/j"),
        ("suspend", "j"),
    ]

    # A step without a checkpoint clears what an earlier one may have left (so no stale
    # image is resumed from); a malformed pointer is refused before anything is touched.
    connector.calls.clear()
    assert "resume_from" not in executor.run(step("suspend")).result
    bad = executor.run(step("requeue", resume_from=""))
    assert bad.outcome is Outcome.refused
    assert connector.calls == [("pointer", "j", None), ("suspend", "j")]


def test_connectors_that_stage_images_are_not_handed_a_pointer(tmp_path: Path) -> None:
    connector = Staging()
    executor = ConnectorStepExecutor(connector, cluster="k", state_dir=tmp_path)
    assert executor.run(step("requeue", nodes=["n1"], image=IMAGE)).ok
    assert connector.calls == [("requeue", "j", ["n1"], False)]


class Stamping(Staging):
    """A scheduler whose connector stamps what it stops with the step's key (Slurm)."""

    def set_step_key(self, external_id: str, step_key: str) -> None:
        self.calls.append(("key", external_id, step_key))


def test_the_step_key_reaches_a_connector_that_stamps_before_it_stops(tmp_path: Path) -> None:
    connector = Stamping()
    executor = ConnectorStepExecutor(connector, cluster="k", state_dir=tmp_path)
    requeue, suspend = step("requeue", nodes=["n1"]), step("suspend")
    assert executor.run(requeue).ok and executor.run(suspend).ok
    assert connector.calls == [
        ("key", "j", requeue.key),
        ("requeue", "j", ["n1"], False),
        ("key", "j", suspend.key),
        ("suspend", "j"),
    ]


def test_telemetry_and_the_action_worker_share_one_connector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    created: list[Restarting] = []
    served: list[tuple[Any, Any]] = []

    def create(kind: SchedulerKind, **options: Any) -> Restarting:
        created.append(Restarting())
        return created[-1]

    def serve(
        args: argparse.Namespace,
        kind: SchedulerKind,
        connector: Any,
        telemetry: runner.TelemetryRunner | None,
        *,
        state_dir: Path,
    ) -> int:
        served.append((connector, telemetry.connector if telemetry else None))
        return 0

    monkeypatch.setattr(registry, "create", create)
    monkeypatch.setattr(runner, "_serve_actions", serve)
    code = runner.main(
        [
            "--kind=slurm",
            "--cluster=hpc-a",
            "--control-plane=http://127.0.0.1:9",
            "--token=t",
            "--broker=redis://127.0.0.1:9/0",
            f"--state-dir={tmp_path}",
        ]
    )
    assert code == 0
    assert len(created) == 1
    assert served == [(created[0], created[0])]
