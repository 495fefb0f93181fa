"""The shaping cycle plans on the Armada test server and the saga carries the plan out
there, end to end.

Around the Armada test server of tests/support/armada_site.py (executors ``exec-a``: a1,
a2 with 8 H100 each, and ``exec-b``: b1 with 4 A100; not a real Armada, which cannot run
here) run the real parts of a deployment (tests/support/deployment.py): the API on
PostgreSQL over HTTP, a control-plane Celery worker and the Armada connector (``python -m
connectors.runner --kind armada``: telemetry, and the scheduler-level steps on queue
``connector.<cluster>``), separate processes on a private Redis, talking to the server
over gRPC on a free port. No plan is built by hand: ``run_cycle`` plans from what the
connector pushed, an operator approves the plan through the API, and its actions reach
Armada only through the connector.

Armada's scheduler is the test server's :meth:`schedule`, run here in rounds by a thread
as Armada's scheduling cycle would run them. A plan's start comes after the stop that
frees its node; Armada reserves nothing in between, so a round in that gap could give the
node to another job of the queue. The rounds here wait for the plan's start step, so that
the test checks one outcome: the job the plan starts goes first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import Session

from agent import procs
from app.actions.models import ActionKind
from app.core.lookup import row_id
from app.gpu_models import service as gpu_model_service
from app.gpu_models.models import GpuModelCreate
from app.plans.models import Plan
from app.shaping.cycle import run_cycle
from connectors.armada import ArmadaConnector, NewJob
from solver import SolverConfig
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import (
    CLUSTER,
    EXECUTOR_LABEL,
    GPU_LABEL,
    HOLD_QUEUE,
    config_for,
    connector_for,
    start_server,
)
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.plans import action_state, planned_actions, wait_until_settled
from wire.queues import connector_queue

pytestmark = pytest.mark.slow

WAIT_S = 60.0
HELD_REASON = "held by Shaper until a plan starts it"


class Scheduling:
    """Armada's scheduling rounds, every ``interval_s`` while ``gate()`` allows them."""

    def __init__(self, server: ArmadaTestServer, interval_s: float = 0.2) -> None:
        self.server = server
        self.interval_s = interval_s
        self.gate: Callable[[], bool] = lambda: False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._rounds, name="armada-rounds", daemon=True)

    def _rounds(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.gate():
                self.server.schedule()

    def __enter__(self) -> Scheduling:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def server() -> Iterator[ArmadaTestServer]:
    server = start_server()
    yield server
    server.stop()


def _register_a100(session: Session, now: datetime) -> None:
    """exec-b's GPUs, as the site names them (the default catalogue says A100-80G)."""
    a100 = GpuModelCreate.model_validate(
        {"name": "A100", "memory_gib": 80, "precisions": ["fp64", "fp32", "bf16", "fp16"]}
    )
    gpu_model_service.create_gpu_model(session=session, model_in=a100, now=now)


@pytest.fixture(scope="module")
def deployment(
    server: ArmadaTestServer,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """The API, a control worker and the Armada connector around the test server."""
    root = tmp_path_factory.mktemp("armada-deployment")
    options = config_for(server).model_dump(mode="json", exclude={"cluster"}, exclude_none=True)
    with deployment_of(
        root=root,
        database_url=make_postgres_database("armada_end_to_end"),
        clusters=[(CLUSTER, "armada")],
        scopes=["operator", "viewer", f"connector:{CLUSTER}"],
        # The test runs the cycle itself; no periodic one plans meanwhile.
        env={"SHAPER_CYCLE_PERIOD_S": "86400"},
        setup=_register_a100,
    ) as running:
        running["pipeline"].start_connector(
            "armada",
            CLUSTER,
            running["base"],
            *(f"{key}={json.dumps(value)}" for key, value in options.items()),
            interval_s=0.5,
        )
        yield running


@pytest.fixture
def user(server: ArmadaTestServer) -> Iterator[ArmadaConnector]:
    """Armada's own client as a user has it (submit, cancel), apart from the connector."""
    with connector_for(server) as client:
        yield client


def _h100_job(priority: int, armada_priority: float = 0.0) -> NewJob:
    """A whole H100 node's job; ``priority``: Shaper's (label), ``armada_priority``: its
    place in its Armada queue (lower first)."""
    return NewJob(
        image="registry.local/train:1",
        gpus=8,
        priority=armada_priority,
        labels={"shaper.io/priority": str(priority), "shaper.io/kind": "training"},
        node_selector={GPU_LABEL: "H100"},
    )


def _jobs(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = api(deployment, "GET", f"/jobs?cluster={CLUSTER}&limit=1000", "viewer")["items"]
    return {job["external_id"]: job for job in items}


def _until_the_api_shows(
    deployment: dict[str, Any], what: str, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, Any]]:
    seen: list[dict[str, Any]] = [{}]

    def holds() -> bool:
        seen[0] = _jobs(deployment)
        return condition(seen[0])

    if not procs.wait_until(holds, timeout=WAIT_S, interval=0.25):
        shown = {
            name: {k: job.get(k) for k in ("state", "reason", "gpus_requested", "allocations")}
            for name, job in seen[0].items()
        }
        raise AssertionError(
            f"timed out waiting for the API to show {what}; it shows {shown}\n"
            f"{deployment['pipeline'].logs()}"
        )
    return seen[0]


def _gpus(job: dict[str, Any]) -> dict[str, int]:
    return {a["node"]: a["gpu_count"] for a in job["allocations"]}


def _cycle(deployment: dict[str, Any], config: SolverConfig | None = None) -> int:
    with Session(deployment["pipeline"].engine) as session:
        result = run_cycle(
            session=session,
            cluster_name=CLUSTER,
            now=datetime.now(UTC),
            policy="shaper",
            config=config,
        )
    if not result.actions or result.kept or result.violations:
        with Session(deployment["pipeline"].engine) as session:
            plan = session.get(Plan, result.plan_id)
            assert plan is not None
            raise AssertionError(f"{result}: {plan.decisions} {plan.summary}")
    return result.plan_id


def _step_done(engine: Any, action_id: int, name: str) -> bool:
    _, steps = action_state(engine, action_id)
    return any(s.name == name and s.state == "succeeded" for s in steps)


def _approve_and_wait(
    deployment: dict[str, Any], server: ArmadaTestServer, plan_id: int, action_ids: list[int]
) -> None:
    pipeline = deployment["pipeline"]
    api(deployment, "POST", f"/plans/{plan_id}/approve", "operator")
    states = wait_until_settled(
        pipeline.engine,
        action_ids,
        timeout_s=WAIT_S,
        context=lambda: (
            "Armada jobs: "
            f"{[(j.job_id, j.queue, j.state, j.node, j.priority) for j in server.jobs.values()]}"
            f"\n{pipeline.logs()}"
        ),
    )
    assert set(states.values()) == {"succeeded"}, (states, pipeline.logs())


def _current(server: ArmadaTestServer, workload: str) -> Any:
    """The workload's newest Armada job (a resubmission names its first job's id)."""
    lineage = [
        job
        for job in server.jobs.values()
        if job.job_id == workload or job.spec.annotations.get("shaper.io/workload") == workload
    ]
    return max(lineage, key=lambda job: job.seq)


def test_the_shaping_cycle_preempts_a_low_priority_armada_job_and_the_saga_carries_it_out(
    server: ArmadaTestServer, deployment: dict[str, Any], user: ArmadaConnector
) -> None:
    """Both H100 nodes of exec-a are held by training jobs of queue ``research``, one of
    low priority; in queue ``prod`` a high-priority job waits behind a low-priority one
    that Armada would run first (its Armada priority is lower). The cycle, on the
    connector's telemetry, plans to stop the low job (requeued into the cordoned hold
    queue: Armada has no held state) and start the high one on its node; approved through
    the API, the saga runs it through the connector, which pins the high job there and
    puts it first in its queue, and Armada runs it there ahead of the other. When it is
    done, a second cycle starts the held job again."""
    engine = deployment["pipeline"].engine
    low = user.submit_job("research", "train", _h100_job(10))
    other = user.submit_job("research", "train", _h100_job(40))
    assert server.schedule() == [low, other]
    low_node = server.job(low).node
    assert {low_node, server.job(other).node} == {"a1", "a2"}
    peer = user.submit_job("prod", "serve", _h100_job(5, armada_priority=1))
    high = user.submit_job("prod", "serve", _h100_job(90, armada_priority=5))

    jobs = _until_the_api_shows(
        deployment,
        "both H100 nodes busy and two jobs waiting for 8 GPUs",
        lambda jobs: (
            all(_gpus(jobs.get(name, {"allocations": []})) for name in (low, other))
            and all(
                jobs.get(name, {}).get("state") == "pending" and jobs[name]["gpus_requested"] == 8
                for name in (peer, high)
            )
        ),
    )
    assert _gpus(jobs[low]) == {low_node: 8}
    assert jobs[high]["queue"] == "prod" and jobs[high]["allowed_gpu_models"] == ["H100"]

    with Scheduling(server) as scheduling:
        # --- cycle 1: stop the low job for the high one (policy "shaper") ----------------
        plan_id = _cycle(deployment)
        planned = planned_actions(engine, plan_id)
        assert sorted(job for _, job in planned) == sorted([high, low]), planned
        by_job = {job: action for action, job in planned}
        stop, start = by_job[low], by_job[high]
        assert stop.kind == ActionKind.preempt and stop.source_placement == {low_node: 8}
        assert start.kind == ActionKind.start and start.target_placement == {low_node: 8}
        assert start.depends_on == [row_id(stop)]

        scheduling.gate = lambda: _step_done(engine, row_id(start), "start")
        _approve_and_wait(deployment, server, plan_id, [row_id(stop), row_id(start)])
        queue = connector_queue(CLUSTER)
        for action, steps in ((stop, ["requeue", "confirm"]), (start, ["start", "confirm"])):
            _, rows = action_state(engine, row_id(action))
            assert [(s.name, s.queue) for s in rows] == [(name, queue) for name in steps]
            assert all(s.state == "succeeded" for s in rows), rows

        # Armada's view: the low job cancelled and submitted again into the cordoned hold
        # queue, whole (8 GPUs), not pinned (the scheduler may start it anywhere); the high
        # job submitted again pinned to the low job's node and its executor, ahead of the
        # peer in its queue, and running there; the peer and the other job untouched.
        assert server.job(low).state == "cancelled"
        held = _current(server, low)
        assert (held.queue, held.state, held.gpus) == (HOLD_QUEUE, "queued", 8)
        assert held.node_selector == {GPU_LABEL: "H100"}
        started = _current(server, high)
        assert server.job(high).state == "cancelled" and started.job_id != high
        assert (started.queue, started.state, started.node) == ("prod", "running", low_node)
        assert started.node_selector == {
            GPU_LABEL: "H100",
            "kubernetes.io/hostname": low_node,
            EXECUTOR_LABEL: "exec-a",
        }
        assert started.priority < server.job(peer).priority == 1
        assert (server.job(peer).state, server.job(other).state) == ("queued", "running")

        # The held job as the control plane sees it: pending for all its GPUs, so that a
        # later plan can start it again.
        _until_the_api_shows(
            deployment,
            "the high job running where the low one was, and the low one held for 8 GPUs",
            lambda jobs: (
                jobs[high]["state"] == "running"
                and _gpus(jobs[high]) == {low_node: 8}
                and jobs[low]["state"] == "pending"
                and jobs[low]["reason"] == HELD_REASON
                and jobs[low]["gpus_requested"] == 8
                and jobs[low]["queue"] == "research"
                and jobs[low]["allowed_gpu_models"] == ["H100"]
            ),
        )

        # --- cycle 2: the high job is done; the held one starts again ----------------------
        user.cancel(peer)  # its user gives up: what is left is the held job's to take
        server.finish(started.job_id)
        _until_the_api_shows(
            deployment,
            "the high job finished",
            lambda jobs: jobs[high]["state"] == "finished" and jobs[peer]["state"] == "cancelled",
        )
        # The solver leaves a job Shaper stopped alone for its dwell time (10 minutes by
        # default): this cycle is asked for none rather than run 10 minutes later.
        plan_id = _cycle(deployment, SolverConfig(dwell_s=0))
        planned = planned_actions(engine, plan_id)
        assert [(job, action.kind) for action, job in planned] == [(low, ActionKind.start)]
        (restart,) = (action for action, _ in planned)
        target = next(iter(restart.target_placement))
        assert restart.target_placement == {target: 8} and target in ("a1", "a2")
        scheduling.gate = lambda: _step_done(engine, row_id(restart), "start")
        _approve_and_wait(deployment, server, plan_id, [row_id(restart)])

    again = _current(server, low)
    assert (again.queue, again.state, again.node) == ("research", "running", target)
    assert again.spec.annotations["shaper.io/attempt"] == "2"
    assert server.jobs_of(HOLD_QUEUE, "train")[0].state == "cancelled"
    _until_the_api_shows(
        deployment,
        "the low job running again",
        lambda jobs: (
            jobs[low]["state"] == "running"
            and _gpus(jobs[low]) == {target: 8}
            and jobs[low]["restart_count"] == 2
        ),
    )
