"""Small builders for simulator tests: workloads, and a planner that replays a script."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from sim.actions import Action, SimPlan
from sim.engine import Simulation
from sim.workload import BlockJob, GpuModel, Node, NodeEvent, Service, Transfer, Workload

HOUR = 3600.0


def job(
    job_id: str,
    *,
    gpus: int,
    hours: float,
    at_h: float = 0.0,
    priority: float = 1.0,
    checkpointable: bool = False,
    checkpoint_interval_h: float = 0.0,
    image_gb: float = 10.0,
    models: Sequence[str] = (),
) -> BlockJob:
    return BlockJob(
        id=job_id,
        submit_time=at_h * HOUR,
        gpus=gpus,
        work=hours * HOUR,
        priority=priority,
        checkpointable=checkpointable,
        checkpoint_interval=checkpoint_interval_h * HOUR,
        image_gb=image_gb,
        gpu_models=tuple(models),
    )


def elastic(
    job_id: str,
    *,
    gpus: int,
    hours: float,
    min_gpus: int | None = 1,
    max_gpus: int = 4,
    scaling: float = 1.0,
    checkpointable: bool = True,
    at_h: float = 0.0,
) -> BlockJob:
    """An elastic training job (``BlockJob.max_gpus``), checkpointable unless told."""
    base = job(job_id, gpus=gpus, hours=hours, checkpointable=checkpointable, at_h=at_h)
    return replace(base, min_gpus=min_gpus, max_gpus=max_gpus, scaling=scaling)


def workload(
    jobs: Sequence[BlockJob],
    *,
    nodes: Sequence[tuple[str, int]] = (("n0", 4),),
    model: str = "A100",
    horizon_h: float = 10.0,
    services: Sequence[Service] = (),
    events: Sequence[NodeEvent] = (),
    transfer: Transfer | None = None,
    replan_min: float = 30.0,
    extra_models: Sequence[GpuModel] = (),
    node_models: dict[str, str] | None = None,
) -> Workload:
    models = {model: GpuModel(name=model)} | {m.name: m for m in extra_models}
    node_models = node_models or {}
    return Workload(
        name="test",
        gpu_models=models,
        nodes=[Node(name=n, gpu_model=node_models.get(n, model), gpus=g) for n, g in nodes],
        jobs=list(jobs),
        services=list(services),
        node_events=list(events),
        horizon=horizon_h * HOUR,
        transfer=transfer or Transfer(bandwidth_mib_per_s=1024.0, overhead_s=0.0),
        replan_interval=replan_min * 60.0,
    )


class ScriptedPlanner:
    """Returns, at each re-plan, the actions a script gives for the current state."""

    name = "scripted"

    def __init__(self, script: Callable[[Simulation], list[Action]]) -> None:
        self.script = script
        self.calls: list[float] = []

    def plan(self, sim: Simulation) -> SimPlan:
        self.calls.append(sim.now)
        return SimPlan(actions=self.script(sim))


def at(schedule: dict[float, list[Action]]) -> Callable[[Simulation], list[Action]]:
    """A script that issues the given actions at the given simulated hours."""

    def script(sim: Simulation) -> list[Action]:
        return schedule.get(round(sim.now / HOUR, 6), [])

    return script
