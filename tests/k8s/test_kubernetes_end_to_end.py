"""A real Kubernetes + Kueue cluster under Shaper, end to end, with nothing simulated but
the nodes (kwok plays their kubelets).

Around the test control plane (tests/k8s/conftest.py) run the real parts of a deployment:
the API on PostgreSQL over HTTP, a control-plane Celery worker and the Kueue connector
(``python -m connectors.runner --kind kueue``: telemetry and the scheduler-level steps on
queue ``connector.<cluster>``), separate processes on a private Redis. Plans are stored as
the shaping cycle stores them and approved through the API; their actions reach the
cluster only through the connector.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from kubernetes import client
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind
from app.jobs.models import Job
from app.shaping.cycle import run_cycle
from tests.k8s.conftest import GPUS_PER_NODE, NODES, K8sCluster, Kube, wait_for
from tests.k8s.objects import (
    admitted,
    elastic_training_job,
    gpu_job,
    gpu_pods_anywhere,
    gpu_queues,
    inference_deployment,
    running_pods,
)
from tests.k8s.test_kubernetes_replica_moves import ready_pods, spread_service
from tests.support.deployment import deployment as deployment_of
from tests.support.plans import planned_actions, stored_plan, wait_until_settled

pytestmark = pytest.mark.slow

CLUSTER = "k8s-e2e"
OTHER = "k8s-other"
# The same control plane through the plain Kubernetes connector: Kueue cannot be told where
# a job goes, so the solver plans no move or resize on a Kueue cluster (app.shaping.snapshot).
PLAIN = "k8s-plain"
# The plain connector with pod_placement on: it may move a Deployment's replicas.
MOVES = "k8s-moves"
WAIT_S = 90.0


@pytest.fixture(scope="module")
def deployment(
    k8s_cluster: K8sCluster,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """The API, a control worker and the Kueue connector around the test control plane."""
    root = tmp_path_factory.mktemp("k8s-deployment")
    with deployment_of(
        root=root,
        database_url=make_postgres_database("k8s_e2e"),
        clusters=[
            (CLUSTER, "kueue"),
            (OTHER, "kueue"),
            (PLAIN, "kubernetes"),
            (MOVES, "kubernetes"),
        ],
        scopes=[
            "operator",
            "viewer",
            f"connector:{CLUSTER}",
            f"connector:{OTHER}",
            f"connector:{PLAIN}",
            f"connector:{MOVES}",
        ],
        # the tests store their plans; no cycle replaces them
        env={"SHAPER_CYCLE_PERIOD_S": "86400"},
    ) as running:
        running["pipeline"].start_connector(
            "kueue", CLUSTER, running["base"], f"kubeconfig={k8s_cluster.kubeconfig}", interval_s=5
        )
        yield running


def _connector_log(deployment: dict[str, Any], cluster: str = CLUSTER) -> str:
    return str(deployment["pipeline"].workers[f"connector-{cluster}"].tail())


def _api(deployment: dict[str, Any], path: str, role: str = "viewer", **params: Any) -> Any:
    response = httpx.get(
        f"{deployment['base']}/api/v1{path}",
        params=params,
        headers={"Authorization": f"Bearer {deployment['tokens'][role]}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _job(
    deployment: dict[str, Any], external_id: str, cluster: str = CLUSTER
) -> dict[str, Any] | None:
    items = _api(deployment, "/jobs", cluster=cluster, limit=1000)["items"]
    return next((j for j in items if j["external_id"] == external_id), None)


def _approve_plan_and_wait(deployment: dict[str, Any], ids: list[int]) -> dict[int, str]:
    plan_id, *action_ids = ids
    response = httpx.post(
        f"{deployment['base']}/api/v1/plans/{plan_id}/approve",
        headers={"Authorization": f"Bearer {deployment['tokens']['operator']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return wait_until_settled(
        deployment["pipeline"].engine,
        action_ids,
        timeout_s=2 * WAIT_S,
        context=lambda: f"connector log:\n{_connector_log(deployment)}",
    )


@contextmanager
def _priority_classes(kube: Kube, classes: dict[str, int]) -> Iterator[None]:
    """PriorityClasses (name → value) that preempt nothing, for the test's duration: the
    scheduler's own priority preemption would otherwise act before any plan."""
    scheduling = client.SchedulingV1Api(kube.api)
    created: list[str] = []
    try:
        for name, value in classes.items():
            scheduling.create_priority_class(
                client.V1PriorityClass(
                    metadata=client.V1ObjectMeta(name=name), value=value, preemption_policy="Never"
                )
            )
            created.append(name)
        yield
    finally:
        for name in created:
            scheduling.delete_priority_class(name)


def _running_replicas(kube: Kube, name: str) -> int:
    pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=f"app={name}").items
    live = [p for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp]
    return sum(1 for pod in live if pod.status.phase == "Running")


def test_the_cluster_reaches_the_api(deployment: dict[str, Any], kube: Kube) -> None:
    nodes = _api(deployment, "/nodes", cluster=CLUSTER, limit=1000)["items"]
    kwok = [n for n in nodes if n["name"].startswith("kwok-gpu-")]
    assert len(kwok) >= NODES
    assert {(n["gpu_model"], n["gpu_count"]) for n in kwok} == {("H100", GPUS_PER_NODE)}

    kube.apps.create_namespaced_deployment(kube.namespace, inference_deployment("chat", replicas=1))
    external_id = f"{kube.namespace}/deployment/chat"
    job = wait_for(
        f"{external_id} in the API",
        lambda: (j := _job(deployment, external_id)) and j["state"] == "running" and j,
    )
    assert job["shape"] == "elastic" and job["kind"] == "realtime_inference"
    assert (job["min_replicas"], job["max_replicas"], job["replicas"]) == (1, 4, 1)
    assert sum(a["gpu_count"] for a in job["allocations"]) == 1


def test_a_plan_scales_an_inference_deployment_up_and_down(
    deployment: dict[str, Any], kube: Kube
) -> None:
    kube.apps.create_namespaced_deployment(
        kube.namespace, inference_deployment("search", replicas=1)
    )
    external_id = f"{kube.namespace}/deployment/search"
    wait_for(
        f"{external_id} running in the API",
        lambda: (j := _job(deployment, external_id)) and j["state"] == "running",
    )
    engine = deployment["pipeline"].engine
    for replicas in (3, 1):
        ids = stored_plan(
            engine,
            [{"job": external_id, "kind": ActionKind.resize, "target_replicas": replicas}],
            tag=f"k8s-resize-{kube.namespace}-{replicas}",
        )
        assert list(_approve_plan_and_wait(deployment, ids).values()) == ["succeeded"]
        scaled = kube.apps.read_namespaced_deployment(external_id.split("/")[-1], kube.namespace)
        assert scaled.spec.replicas == replicas
        wait_for(
            f"{replicas} running replicas of search",
            lambda replicas=replicas: _running_replicas(kube, "search") == replicas,
        )
        wait_for(
            f"the API to show {replicas} replicas",
            lambda replicas=replicas: (
                (j := _job(deployment, external_id)) and j["replicas"] == replicas
            ),
        )


def test_only_the_clusters_own_connector_may_push(deployment: dict[str, Any]) -> None:
    base, tokens = deployment["base"], deployment["tokens"]
    snapshot = {"kind": "snapshot", "connector_session": "intruder", "seq": 1, "nodes": []}
    for role, status in (("viewer", 403), ("operator", 403), (f"connector:{OTHER}", 403)):
        response = httpx.post(
            f"{base}/api/v1/clusters/{CLUSTER}/telemetry",
            json=snapshot,
            headers={"Authorization": f"Bearer {tokens[role]}"},
            timeout=30,
        )
        assert response.status_code == status, (role, response.text)
    # Nothing of the refused pushes landed: the cluster still has its nodes.
    assert _api(deployment, "/nodes", cluster=CLUSTER)["total"] >= NODES


def test_a_plan_holds_a_strict_fifo_blocker_and_starts_the_workload_behind_it(
    deployment: dict[str, Any], kube: Kube
) -> None:
    """StrictFIFO, 8 GPUs of quota, 4 in use: an 8-GPU workload at the head of the queue
    leaves a 2-GPU one waiting though it fits (tests/k8s/test_kueue_actions.py shows Kueue
    does). A plan that holds the blocker (requeue, held: the connector deactivates its
    Workload) and then starts the small one gets it admitted and running; the blocker
    waits, deactivated, for a later plan."""
    queue = gpu_queues(kube, gpus=8, strategy="StrictFIFO")
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("running", gpus=4, queue=queue))
    wait_for("running to be admitted", lambda: admitted(kube, "running"))
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("large", gpus=8, queue=queue))
    wait_for("large's Workload", lambda: kube.workload_of_job("large"))
    time.sleep(1.1)  # Workloads are ordered by creation time, to the second
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("small", gpus=2, queue=queue))
    large, small = (f"{kube.namespace}/job/{name}" for name in ("large", "small"))
    for external_id in (large, small):
        wait_for(
            f"{external_id} pending in the API",
            lambda external_id=external_id: (
                (j := _job(deployment, external_id)) and j["state"] == "pending"
            ),
        )
    assert admitted(kube, "small") is None, "Kueue admitted small past the head on its own"

    ids = stored_plan(
        deployment["pipeline"].engine,
        [
            {"job": large, "kind": ActionKind.requeue},
            {"job": small, "kind": ActionKind.start, "after": [0]},
        ],
        tag=f"k8s-fifo-{kube.namespace}",
    )
    assert list(_approve_plan_and_wait(deployment, ids).values()) == ["succeeded"] * 2
    assert admitted(kube, "small") and running_pods(kube, "small")
    workload = kube.workload_of_job("large")
    assert workload is not None and workload["spec"]["active"] is False
    wait_for(
        "the API to show small running and large held",
        lambda: (
            (s := _job(deployment, small))
            and s["state"] == "running"
            and (b := _job(deployment, large))
            and b["state"] == "pending"
            and b["reason"] == "deactivated"
        ),
    )


def test_the_shaping_cycle_plans_on_the_clusters_telemetry_and_its_start_runs(
    deployment: dict[str, Any], kube: Kube
) -> None:
    """No stored plan: the shaping cycle itself (snapshot of what the connector pushed,
    the solver, the review) plans for the Kubernetes cluster. A plain Job created
    suspended, as a site holds work outside any queue, asks for 2 GPUs that are free: the
    cycle's plan starts it on a node of its choosing; approved through the API, the
    connector pins the Job there and lets it run, and the API sees it running there."""
    job = gpu_job("held", gpus=2)
    job.spec.suspend = True
    kube.batch.create_namespaced_job(kube.namespace, job)
    external_id = f"{kube.namespace}/job/held"
    wait_for(
        f"{external_id} pending in the API",
        lambda: (j := _job(deployment, external_id)) and j["state"] == "pending",
    )
    engine = deployment["pipeline"].engine
    with Session(engine) as session:
        result = run_cycle(session=session, cluster_name=CLUSTER, now=datetime.now(UTC))
    assert result.actions >= 1 and not result.kept, result
    with Session(engine) as session:
        planned = session.exec(
            select(Action, Job)
            .join(Job, Action.job_id == Job.id)  # type: ignore[arg-type]
            .where(Action.plan_id == result.plan_id)
        ).all()
    starts = [a for a, j in planned if j.external_id == external_id]
    assert [a.kind for a in starts] == [ActionKind.start], [
        (a.kind, j.external_id) for a, j in planned
    ]
    target = starts[0].target_node
    assert target is not None, "a start planned on no node"
    # Only this Job's start is approved (with any prerequisite of it): the plan may also act
    # on what earlier tests left in the cluster.
    approved = httpx.post(
        f"{deployment['base']}/api/v1/actions/{starts[0].id}/approve",
        headers={"Authorization": f"Bearer {deployment['tokens']['operator']}"},
        timeout=30,
    )
    assert approved.status_code == 200, approved.text
    states = wait_until_settled(
        engine,
        [starts[0].id, *approved.json()["depends_on"]],
        timeout_s=2 * WAIT_S,
        context=lambda: f"connector log:\n{_connector_log(deployment)}",
    )
    assert states[starts[0].id] == "succeeded", states
    (pod,) = wait_for("held's pod to run", lambda: running_pods(kube, "held"))
    assert pod.spec.node_name == target
    wait_for(
        f"the API to show {external_id} running on {target}",
        lambda: (
            (j := _job(deployment, external_id))
            and j["state"] == "running"
            and {a["node"] for a in j["allocations"]} == {target}
        ),
    )


def test_the_cycle_shrinks_an_elastic_indexed_job_for_a_higher_priority_one(
    deployment: dict[str, Any], kube: Kube, k8s_cluster: K8sCluster
) -> None:
    """A low-priority elastic training job (an Indexed Job of 1 to 3 whole-node pods)
    holds every GPU; a higher-priority Job, held, asks for a node. The shaping cycle shrinks
    the elastic job to two pods instead of stopping it and starts the other Job on the
    node given back; approved through the API, the connector process carries both out and
    the API sees the result. (Priority classes that preempt nothing: the scheduler's own
    priority preemption would otherwise act first.)"""
    suffix = kube.namespace
    with _priority_classes(kube, {f"low-{suffix}": 10, f"high-{suffix}": 90}):
        deployment["pipeline"].start_connector(
            "kubernetes",
            PLAIN,
            deployment["base"],
            f"kubeconfig={k8s_cluster.kubeconfig}",
            f'namespaces=["{kube.namespace}"]',
            interval_s=5,
        )
        wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube), timeout=WAIT_S)
        elastic = elastic_training_job("elastic", pods=NODES, gpus=GPUS_PER_NODE, high=NODES)
        elastic.spec.template.spec.priority_class_name = f"low-{suffix}"
        kube.batch.create_namespaced_job(kube.namespace, elastic)
        wait_for("3 elastic pods", lambda: len(running_pods(kube, "elastic")) == NODES)
        urgent = gpu_job("urgent", gpus=GPUS_PER_NODE)
        urgent.spec.suspend = True
        urgent.spec.template.spec.priority_class_name = f"high-{suffix}"
        kube.batch.create_namespaced_job(kube.namespace, urgent)
        elastic_id, urgent_id = (f"{kube.namespace}/job/{n}" for n in ("elastic", "urgent"))
        wait_for(
            "the API to show the elastic job on every node and the urgent one waiting",
            lambda: (
                (e := _job(deployment, elastic_id, PLAIN))
                and (u := _job(deployment, urgent_id, PLAIN))
                and sum(a["gpu_count"] for a in e["allocations"]) == NODES * GPUS_PER_NODE
                and (e["min_replicas"], e["max_replicas"]) == (1, NODES)
                and u["state"] == "pending"
                and u["priority"] == 90
            ),
        )
        engine = deployment["pipeline"].engine
        with Session(engine) as session:
            result = run_cycle(
                session=session, cluster_name=PLAIN, now=datetime.now(UTC), policy="shaper"
            )
        assert result.actions and not result.violations, result
        planned = planned_actions(engine, result.plan_id)
        by_kind = {(job, action.kind): action for action, job in planned}
        shrink = by_kind[(elastic_id, ActionKind.resize)]
        start = by_kind[(urgent_id, ActionKind.start)]
        assert shrink.target_replicas == 2 and "shrunk from 3 to 2" in (shrink.reason or "")
        (freed,) = set(shrink.source_placement) - set(shrink.target_placement)
        assert start.target_placement == {freed: GPUS_PER_NODE}
        assert ActionKind.preempt not in {a.kind for a, j in planned if j == elastic_id}

        approved = httpx.post(
            f"{deployment['base']}/api/v1/actions/{start.id}/approve",
            headers={"Authorization": f"Bearer {deployment['tokens']['operator']}"},
            timeout=30,
        )
        assert approved.status_code == 200, approved.text
        assert shrink.id in approved.json()["depends_on"]
        states = wait_until_settled(
            engine,
            [start.id, *approved.json()["depends_on"]],
            timeout_s=2 * WAIT_S,
            context=lambda: f"connector log:\n{_connector_log(deployment, PLAIN)}",
        )
        assert set(states.values()) == {"succeeded"}, states
        kept = sorted(shrink.target_placement)
        wait_for(
            "the elastic job on the two kept nodes and the urgent one on the third",
            lambda: (
                sorted(p.spec.node_name for p in running_pods(kube, "elastic")) == kept
                and [p.spec.node_name for p in running_pods(kube, "urgent")] == [freed]
            ),
        )
        spec = kube.batch.read_namespaced_job("elastic", kube.namespace).spec
        assert (spec.completions, spec.parallelism) == (2, 2)
        wait_for(
            "the API to show both where the plan put them",
            lambda: (
                (e := _job(deployment, elastic_id, PLAIN))
                and {a["node"] for a in e["allocations"]} == set(kept)
                and (u := _job(deployment, urgent_id, PLAIN))
                and {a["node"] for a in u["allocations"]} == {freed}
            ),
        )


def test_the_cycle_moves_a_services_replica_off_the_node_a_job_needs(
    deployment: dict[str, Any], kube: Kube, k8s_cluster: K8sCluster
) -> None:
    """A service's two 1-GPU replicas run on two of the three nodes (P and Q); Q and the
    third node R each run a 7-GPU Job of higher priority that cannot checkpoint; a held
    8-GPU Job fits only on P once the replica there has gone. The shaping cycle, from the
    telemetry of a connector with ``pod_placement``, plans the replica's move: the service
    shrinks off P (the connector marks that pod), the Job starts on P, then the service
    grows back to two replicas, which the scheduler can only put on R. Approved through
    the API, the connector process carries it out. (Priority classes that preempt
    nothing: the scheduler's own priority preemption would otherwise act first.)"""
    suffix = kube.namespace
    with _priority_classes(kube, {f"fill-{suffix}": 90, f"gang-{suffix}": 50}):
        deployment["pipeline"].start_connector(
            "kubernetes",
            MOVES,
            deployment["base"],
            f"kubeconfig={k8s_cluster.kubeconfig}",
            f'namespaces=["{kube.namespace}"]',
            "pod_placement=true",
            interval_s=5,
        )
        wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube), timeout=WAIT_S)
        kube.apps.create_namespaced_deployment(kube.namespace, spread_service("svc", replicas=2))
        placed = wait_for("svc's 2 replicas, on two nodes", lambda: ready_pods(kube, "svc", 2))
        nodes = sorted(
            {n.metadata.name for n in kube.core.list_node(label_selector="type=kwok").items}
        )
        p, q = sorted(placed.values())
        (r,) = set(nodes) - {p, q}
        for node in (q, r):
            filler = gpu_job(f"fill-{node}", gpus=GPUS_PER_NODE - 1, checkpointable=False)
            filler.spec.template.spec.node_selector = {"kubernetes.io/hostname": node}
            filler.spec.template.spec.priority_class_name = f"fill-{suffix}"
            kube.batch.create_namespaced_job(kube.namespace, filler)
        wait_for(
            "both fillers running",
            lambda: all(running_pods(kube, f"fill-{node}") for node in (q, r)),
        )
        big = gpu_job("big", gpus=GPUS_PER_NODE, checkpointable=False)
        big.spec.suspend = True
        big.spec.template.spec.priority_class_name = f"gang-{suffix}"
        kube.batch.create_namespaced_job(kube.namespace, big)
        service_id, big_id = (f"{kube.namespace}/{k}" for k in ("deployment/svc", "job/big"))
        wait_for(
            "the API to show the service on P and Q, movable, and the big job waiting",
            lambda: (
                (svc := _job(deployment, service_id, MOVES))
                and svc["replicas_movable"]
                and {a["node"] for a in svc["allocations"]} == {p, q}
                and (b := _job(deployment, big_id, MOVES))
                and b["state"] == "pending"
                and all(
                    (f := _job(deployment, f"{kube.namespace}/job/fill-{node}", MOVES))
                    and f["state"] == "running"
                    for node in (q, r)
                )
            ),
        )
        engine = deployment["pipeline"].engine
        with Session(engine) as session:
            result = run_cycle(
                session=session, cluster_name=MOVES, now=datetime.now(UTC), policy="shaper"
            )
        assert result.actions and not result.violations, result
        planned = planned_actions(engine, result.plan_id)
        resizes = [a for a, job in planned if job == service_id and a.kind == ActionKind.resize]
        (start,) = [a for a, job in planned if job == big_id and a.kind == ActionKind.start]
        assert [(a.source_placement, a.target_placement, a.target_replicas) for a in resizes] == [
            ({p: 1, q: 1}, {q: 1}, 1),
            ({q: 1}, {q: 1, r: 1}, 2),
        ]
        assert start.target_placement == {p: GPUS_PER_NODE}
        assert {a.kind for a, _ in planned} == {ActionKind.resize, ActionKind.start}

        states = _approve_plan_and_wait(deployment, [result.plan_id, *(a.id for a, _ in planned)])
        assert set(states.values()) == {"succeeded"}, states
        wait_for(
            "the big job on P and the service back at two replicas, on Q and R",
            lambda: (
                [pod.spec.node_name for pod in running_pods(kube, "big")] == [p]
                and (now := ready_pods(kube, "svc", 2)) is not None
                and sorted(now.values()) == sorted([q, r])
            ),
            timeout=WAIT_S,
        )
