"""The pure translations of the Kubernetes and Kueue connectors, on small dict fixtures, and
the runner's wake-up on a connector that reports changes.

The Workload fixtures are trimmed from objects Kueue v0.17.0 (Apache-2.0) wrote on the
tests' control plane (tests/k8s); the pods and nodes follow what kube-apiserver v1.37
serves (Apache-2.0). The real thing is exercised in tests/k8s."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from connectors.kubernetes.nodes import gpu_model_name, node_report, node_state
from connectors.kubernetes.pins import RESUME_FROM
from connectors.kubernetes.pods import (
    JobGroup,
    OwnerRef,
    TranslationContext,
    group_pods,
    job_report,
    owner_of,
    parse_external_id,
    pinned_nodes,
    pod_spec_gpus,
    resume_blocker,
)
from connectors.kueue.workloads import KueueQueues, workload_report, workload_state
from connectors.runner import RunnerConfig, TelemetryRunner
from wire.checkpoint_image import ImageRestore
from wire.telemetry import ClusterState, JobShape, JobState, NodeState

NOW = "2026-12-03T10:29:56Z"


def node(name: str = "n1", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
            },
        },
        "spec": status.pop("spec", {}),
        "status": {
            "allocatable": {"cpu": "64", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": status.pop("ready", "True")}],
        },
    }


def pod(
    name: str,
    *,
    owner: tuple[str, str] | None = None,
    node_name: str | None = None,
    phase: str = "Running",
    gpus: int = 1,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "labels": labels or {},
        "creationTimestamp": NOW,
    }
    if owner:
        metadata["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    limits = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase, "startTime": NOW}}


def job(name: str, *, parallelism: int = 2, suspend: bool = False, gpus: int = 4) -> dict[str, Any]:
    template = {"spec": pod("t", gpus=gpus)["spec"]}
    return {
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": NOW},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "suspend": suspend,
            "template": template,
        },
        "status": {},
    }


CONTEXT = TranslationContext(node_states={"n1": NodeState.up, "n2": NodeState.up})


@pytest.mark.parametrize(
    ("product", "memory", "model"),
    [
        ("NVIDIA-H100-80GB-HBM3", "81559", "H100"),
        ("NVIDIA-A100-SXM4-40GB", "40960", "A100-40G"),
        ("NVIDIA-A100-SXM4-80GB", "81920", "A100-80G"),
        ("NVIDIA-L40S", "46068", "L40S"),
        ("NVIDIA-A10G", "23028", "A10"),
        ("Tesla-T4", "15360", "T4"),
        ("NVIDIA-L4", "23034", "L4"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "4864", "A100-40G-MIG-1g.5gb"),
    ],
)
def test_gfd_products_map_to_catalogue_names(product: str, memory: str, model: str) -> None:
    assert gpu_model_name(product, memory, aliases={}) == model


def test_an_alias_wins_over_the_families() -> None:
    assert gpu_model_name("NVIDIA-L4", None, aliases={"NVIDIA-L4": "G2"}) == "G2"


def test_node_state_from_ready_cordon_and_taints() -> None:
    ignored = ["nvidia.com/gpu"]
    assert node_state(node(), ignored_taints=ignored) is NodeState.up
    assert node_state(node(ready="Unknown"), ignored_taints=ignored) is NodeState.down
    cordoned = node(spec={"unschedulable": True})
    assert node_state(cordoned, ignored_taints=ignored) is NodeState.draining
    gpu_only = node(spec={"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]})
    assert node_state(gpu_only, ignored_taints=ignored) is NodeState.up
    tainted = node(spec={"taints": [{"key": "maintenance", "effect": "NoExecute"}]})
    assert node_state(tainted, ignored_taints=ignored) is NodeState.draining


def test_a_node_never_reports_fewer_gpus_than_its_pods_hold() -> None:
    restarting_plugin = node()
    restarting_plugin["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    restarting_plugin["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    report = node_report(
        restarting_plugin, gpus_held=3, aliases={}, default_gpu_model="gpu", ignored_taints=[]
    )
    assert (report.gpu_model, report.gpu_count, report.memory_mib) == ("H100", 3, 1024 * 1024)
    assert report.labels["shaper.io/allocatable.nvidia.com/mig-1g.10gb"] == "7"


def test_owners_and_external_ids() -> None:
    rs = pod("p", owner=("ReplicaSet", "llm-5d8f9"), labels={"pod-template-hash": "5d8f9"})
    assert owner_of(rs) == OwnerRef("Deployment", "ml", "llm")
    js = pod("p", owner=("Job", "big-w-0"), labels={"jobset.sigs.k8s.io/jobset-name": "big"})
    assert owner_of(js).external_id == "ml/jobset/big"
    assert owner_of(pod("solo")).external_id == "ml/pod/solo"
    assert parse_external_id("ml/statefulset/db") == OwnerRef("StatefulSet", "ml", "db")
    long = OwnerRef("Job", "ml", "x" * 253).external_id
    assert len(long) == 255 and long != OwnerRef("Job", "ml", "x" * 252 + "y").external_id


def test_effective_gpu_request_counts_sidecars_and_the_largest_init() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}],
        "initContainers": [
            {"resources": {"limits": {"nvidia.com/gpu": "1"}}, "restartPolicy": "Always"},
            {"resources": {"limits": {"nvidia.com/gpu": "8"}}},
        ],
    }
    assert pod_spec_gpus(spec) == 9  # the sidecar runs beside the 8-GPU init container


def test_pinning_by_hostname_or_node_name() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
                ]
            }
        }
    }
    assert pinned_nodes({"affinity": affinity}) == ["b"]
    assert pinned_nodes({"nodeSelector": {"kubernetes.io/hostname": "a"}}) == ["a"]
    assert pinned_nodes({"nodeSelector": {"zone": "x"}}) == []


def test_a_running_gang_job_with_allocations_per_node() -> None:
    pods = [
        pod("train-a", owner=("Job", "train"), node_name="n1", gpus=4),
        pod("train-b", owner=("Job", "train"), node_name="n2", gpus=4),
        pod("other", gpus=0),
    ]
    groups = group_pods(pods, {"Job": [job("train")]})
    report = job_report(groups["ml/job/train"], CONTEXT)
    assert report is not None
    assert (report.state, report.gang_size, report.gpus_requested) == (JobState.running, 2, 8)
    assert {a.node: a.gpus for a in report.allocations} == {"n1": 4, "n2": 4}
    assert job_report(groups["ml/pod/other"], CONTEXT) is None  # asks for no GPU


def test_a_suspended_job_is_pending_and_pods_on_a_down_node_hold_nothing() -> None:
    held = job_report(JobGroup(OwnerRef("Job", "ml", "q"), job("q", suspend=True)), CONTEXT)
    assert held is not None and (held.state, held.reason) == (JobState.pending, "suspended")
    assert held.gpus_requested == 8 and held.start_time is None
    down = TranslationContext(node_states={"n1": NodeState.down})
    group = JobGroup(OwnerRef("Pod", "ml", "p"), None, [pod("p", node_name="n1", gpus=2)])
    report = job_report(group, down)
    assert report is not None and report.state is JobState.running and report.allocations == []


def test_a_job_to_resume_from_checkpoint_images_must_run_on_their_node() -> None:
    """A Job suspended to resume from checkpoint images has no pod and no pin yet, but the
    restore webhook will hold every pod it makes to the images' node: the telemetry says so,
    so that no plan starts it elsewhere (the start would be refused). That node wins over a
    pin of the template's own; any other pointer, or a malformed one, holds it nowhere."""
    images = ImageRestore(node="n2", images={"c": "localhost/ckpt:1"}).pointer()

    def held(pointer: str | None, *, pin: str | None = None) -> list[str]:
        obj = job("q", suspend=True)
        if pointer is not None:
            obj["spec"]["template"]["metadata"] = {"annotations": {RESUME_FROM: pointer}}
        if pin is not None:
            obj["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": pin}
        report = job_report(JobGroup(OwnerRef("Job", "ml", "q"), obj), CONTEXT)
        assert report is not None and report.state is JobState.pending
        return report.required_nodes

    assert held(images) == ["n2"]
    assert held(images, pin="n1") == ["n2"]
    assert held(None, pin="n1") == ["n1"]
    assert held("s3://bucket/q/step-9") == []
    assert held("checkpoint-image:{not json") == []
    assert held(None) == []


def test_a_deployment_is_elastic_within_its_annotated_range() -> None:
    deployment = {
        "metadata": {
            "name": "llm",
            "namespace": "ml",
            "annotations": {"shaper.io/min-replicas": "1", "shaper.io/max-replicas": "4"},
        },
        "spec": {"replicas": 2, "template": {"spec": pod("t", gpus=1)["spec"]}},
    }
    rs_labels = {"pod-template-hash": "abc"}
    pods = [
        pod(f"llm-abc-{i}", owner=("ReplicaSet", "llm-abc"), node_name="n1", labels=rs_labels)
        for i in range(3)  # a rolling update's surge: one more than asked for
    ]
    groups = group_pods(pods, {"Deployment": [deployment]})
    report = job_report(groups["ml/deployment/llm"], CONTEXT)
    assert report is not None and report.shape is JobShape.elastic
    assert (report.min_replicas, report.replicas, report.max_replicas) == (1, 3, 4)
    assert report.kind.value == "realtime_inference"


def elastic_job(
    name: str, *, size: int = 3, low: str | None = "1", high: str | None = "4", **spec: Any
) -> dict[str, Any]:
    """An Indexed Job of ``size`` 2-GPU pods annotated with a replica range."""
    obj = job(name, parallelism=size, gpus=2)
    obj["spec"]["completionMode"] = "Indexed"
    obj["spec"].update(spec)
    annotations = {"shaper.io/min-replicas": low, "shaper.io/max-replicas": high}
    obj["metadata"]["annotations"] = {k: v for k, v in annotations.items() if v is not None}
    return obj


def test_an_indexed_job_with_a_replica_range_is_elastic_training() -> None:
    pods = [
        pod(f"train-{i}", owner=("Job", "train"), node_name=f"n{1 + i % 2}", gpus=2)
        for i in range(3)
    ]
    groups = group_pods(pods, {"Job": [elastic_job("train")]})
    report = job_report(groups["ml/job/train"], CONTEXT)
    assert report is not None and report.shape is JobShape.block
    # A replica is a pod: 3 of 2 GPUs running, 1..4 allowed, asking for the most.
    assert (report.gang_size, report.gpus_requested) == (3, 6)
    assert (report.min_replicas, report.replicas, report.max_replicas) == (1, 4, 4)
    assert {a.node: a.gpus for a in report.allocations} == {"n1": 4, "n2": 2}
    pending = job_report(JobGroup(OwnerRef("Job", "ml", "q"), elastic_job("q", low=None)), CONTEXT)
    assert pending is not None and (pending.min_replicas, pending.max_replicas) == (1, 4)


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        (elastic_job("j", completionMode="NonIndexed"), "not Indexed: no index to keep"),
        (elastic_job("j", completions=6), "completions > parallelism: not resizable"),
        (elastic_job("j", high=None), "no range declared"),
        (elastic_job("j", low="4", high="4"), "a range of one size"),
        (elastic_job("j", low="0", high="4"), "a floor of no pod"),
        (elastic_job("j", high="many"), "not a number"),
        (elastic_job("j", managedBy="example.com/other"), "another controller's"),
        (elastic_job("j", backoffLimitPerIndex=1), "per-index limits fix its completions"),
        (elastic_job("j", successPolicy={"rules": [{"succeededCount": 2}]}), "success policy"),
        ({**elastic_job("j"), "status": {"succeeded": 1}}, "an index ended"),
        ({**elastic_job("j"), "status": {"failedIndexes": "2"}}, "an index failed"),
    ],
)
def test_other_jobs_stay_rigid(obj: dict[str, Any], why: str) -> None:
    report = job_report(JobGroup(OwnerRef("Job", "ml", "j"), obj), CONTEXT)
    assert report is not None and (report.min_replicas, report.max_replicas) == (0, 0), why


def test_a_job_kueue_manages_stays_rigid_kueue_owns_its_size() -> None:
    obj = elastic_job("j")
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    report = job_report(JobGroup(OwnerRef("Job", "ml", "j"), obj), CONTEXT)
    assert report is not None and report.max_replicas == 0


# Trimmed from Kueue v0.17.0's Workloads of two 2-pod, 4-GPU Jobs on an 8-GPU ClusterQueue.
RESUME_ENV = {
    "name": "SHAPER_RESUME_FROM",
    "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['shaper.io/resume-from']"}},
}


def checkpointable_job(name: str, *, annotation: str | None = "true", env: bool = True) -> Any:
    """A Job whose pod template carries ``annotation`` and, with ``env``, declares the
    resume pointer from the Downward API."""
    obj = job(name, parallelism=1)
    template = obj["spec"]["template"]
    if annotation is not None:
        template["metadata"] = {"annotations": {"shaper.io/checkpointable": annotation}}
    if env:
        for container in template["spec"]["containers"]:
            container["env"] = [RESUME_ENV]
    return obj


@pytest.mark.parametrize(
    ("annotation", "env", "checkpointable"),
    [
        ("true", True, True),
        # What the actions refuse, telemetry does not call checkpointable either: the solver
        # must not plan a move the connector will not make.
        ("True", True, False),
        ("true", False, False),
        (None, True, False),
    ],
)
def test_a_job_is_checkpointable_exactly_when_the_actions_would_move_it(
    annotation: str | None, env: bool, checkpointable: bool
) -> None:
    obj = checkpointable_job("train", annotation=annotation, env=env)
    assert (resume_blocker(obj["spec"]["template"]) is None) is checkpointable
    (group,) = group_pods([], {"Job": [obj]}).values()
    report = job_report(group, CONTEXT)
    assert report is not None and report.checkpointable is checkpointable

    # Before the Job itself is seen, its first pod (made from that template) says the same.
    first = pod("train-0", owner=("Job", "train"), node_name="n1")
    first["metadata"]["annotations"] = (
        obj["spec"]["template"].get("metadata", {}).get("annotations", {})
    )
    first["spec"]["containers"] = obj["spec"]["template"]["spec"]["containers"]
    (from_pod,) = group_pods([first], {}).values()
    report = job_report(from_pod, CONTEXT)
    assert report is not None and report.checkpointable is checkpointable


def test_a_bare_pod_is_never_checkpointable() -> None:
    # No step moves a bare pod (nothing would recreate it), however it is annotated.
    bare = pod("sim", node_name="n1")
    bare["metadata"]["annotations"] = {"shaper.io/checkpointable": "true"}
    bare["spec"]["containers"][0]["env"] = [RESUME_ENV]
    (group,) = group_pods([bare], {}).values()
    report = job_report(group, CONTEXT)
    assert report is not None and report.checkpointable is False


def workload(job_name: str, conditions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"job-{job_name}-8c0f6",
            "namespace": "ml",
            "creationTimestamp": NOW,
            "ownerReferences": [{"kind": "Job", "name": job_name, "controller": True}],
        },
        "spec": {
            "active": extra.pop("active", True),
            "priority": 100,
            "queueName": "lq",
            "podSets": [
                {
                    "name": "main",
                    "count": 2,
                    "template": {"spec": job("t")["spec"]["template"]["spec"]},
                }
            ],
        },
        "status": {"conditions": conditions, **extra},
    }


ADMITTED = workload(
    "j-a",
    [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
        {"type": "Admitted", "status": "True", "reason": "Admitted"},
    ],
    admission={
        "clusterQueue": "cq",
        "podSetAssignments": [{"name": "main", "count": 2, "flavors": {"nvidia.com/gpu": "h100"}}],
    },
)
WAITING = workload(
    "j-b",
    [
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Pending",
            "message": "couldn't assign flavors to pod set main: insufficient unused quota for "
            "nvidia.com/gpu in flavor h100, 8 more needed",
        }
    ],
)
QUEUES = KueueQueues.of(
    local_queues=[{"metadata": {"name": "lq", "namespace": "ml"}, "spec": {"clusterQueue": "cq"}}],
    cluster_queues=[
        {
            "metadata": {"name": "cq"},
            "spec": {
                "resourceGroups": [
                    {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "h100"}]}
                ]
            },
        }
    ],
    flavors=[
        {
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        }
    ],
)


def test_an_admitted_workload_runs_on_its_flavor_with_kueues_priority_and_team() -> None:
    pods = [pod(f"j-a-{i}", owner=("Job", "j-a"), node_name="n1", gpus=4) for i in range(2)]
    group = JobGroup(OwnerRef("Job", "ml", "j-a"), job("j-a"), pods)
    report = workload_report(ADMITTED, group, CONTEXT, QUEUES)
    assert report is not None
    assert (report.state, report.team, report.queue, report.priority) == (
        JobState.running,
        "cq",
        "lq",
        100,
    )
    assert report.allowed_gpu_models == ["H100"] and report.gang_size == 2


def test_a_waiting_workload_says_why_and_a_deactivated_one_is_held() -> None:
    group = JobGroup(OwnerRef("Job", "ml", "j-b"), job("j-b", suspend=True))
    report = workload_report(WAITING, group, CONTEXT, QUEUES)
    assert report is not None and report.state is JobState.pending
    assert report.reason.startswith("couldn't assign flavors to pod set main")
    assert report.team == "cq" and report.gpus_requested == 8
    deactivated = workload("j-b", WAITING["status"]["conditions"], active=False)
    assert workload_state(deactivated, None) == (JobState.pending, "deactivated")
    evicted = workload(
        "j-c", [{"type": "Evicted", "status": "True", "message": "Preempted to fit j-z"}]
    )
    assert workload_state(evicted, None) == (JobState.pending, "evicted: Preempted to fit j-z")


class ChangingConnector:
    """A connector whose scheduler tells of changes (SupportsChangeWait), for the runner."""

    kind = "kubernetes"
    cluster = "c"

    def __init__(self, changes: list[bool]) -> None:
        self.changes = changes
        self.waits: list[float] = []

    def read_state(self) -> ClusterState:
        from datetime import UTC, datetime

        return ClusterState(observed_at=datetime.now(UTC), nodes=[], jobs=[])

    def wait_for_change(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        return self.changes.pop(0) if self.changes else False


def test_the_runner_pushes_on_a_change_after_a_debounce_not_after_its_interval() -> None:
    sleeps: list[float] = []
    connector = ChangingConnector([False, True, True])  # the 2nd slice sees a change
    runner = TelemetryRunner(
        connector,  # type: ignore[arg-type]
        RunnerConfig(
            control_plane="http://cp",
            cluster="c",
            token="t",
            interval_s=30,
            min_push_interval_s=0,
        ),
        transport=httpx.MockTransport(
            lambda r: httpx.Response(200, json={"cluster": "c", "seq": 0})
        ),
        sleep=sleeps.append,
    )
    runner.run(max_cycles=2)
    assert runner.stats.cycles == 2
    assert sleeps == [0.2]  # the debounce; never the 30 s interval
    # Two slices of at most 0.5 s, then the debounce's changes consumed with a 0 s wait.
    assert connector.waits == [0.5, 0.5, 0]


def test_change_driven_pushes_on_a_busy_cluster_keep_the_minimum_interval() -> None:
    """Every slice sees a change (pods churn all the time): each push still waits until
    min_push_interval_s has passed since the previous one began, not just the debounce."""
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(round(seconds, 3))
        now[0] += seconds

    def post(request: httpx.Request) -> httpx.Response:
        now[0] += 0.3  # the push takes 0.3 s
        return httpx.Response(200, json={"cluster": "c", "seq": 0})

    connector = ChangingConnector([True] * 20)
    runner = TelemetryRunner(
        connector,  # type: ignore[arg-type]
        RunnerConfig(
            control_plane="http://cp",
            cluster="c",
            token="t",
            interval_s=30,
            min_push_interval_s=2.0,
        ),
        transport=httpx.MockTransport(post),
        sleep=sleep,
        monotonic=lambda: now[0],
    )
    runner.run(max_cycles=4)
    # Each cycle took 0.3 s to push; the wait tops it up to 2 s between starts.
    assert sleeps == [1.7, 1.7, 1.7]
    # After a quiet spell longer than the minimum, a change waits only for the debounce.
    now[0] += 60
    connector.changes[:] = [True]
    runner._wait_between_cycles()
    assert sleeps[-1] == 0.2


def test_a_jobs_deadline_or_its_pods_is_its_time_limit() -> None:
    def limit(
        job_deadline: object = None, pod_deadline: object = None, retries: int = 0
    ) -> float | None:
        obj = job("train", suspend=True)
        obj["spec"]["backoffLimit"] = retries
        if job_deadline is not None:
            obj["spec"]["activeDeadlineSeconds"] = job_deadline
        if pod_deadline is not None:
            obj["spec"]["template"]["spec"]["activeDeadlineSeconds"] = pod_deadline
        report = job_report(JobGroup(OwnerRef("Job", "ml", "train"), obj), CONTEXT)
        assert report is not None
        return report.time_limit_s

    assert limit() is None
    assert limit(job_deadline=7200) == 7200.0
    assert limit(pod_deadline=3600) == 3600.0
    assert limit(job_deadline=7200, pod_deadline=3600) == 3600.0  # the first to end it
    # A Job that retries: a pod past its deadline is replaced, with a count of its own.
    assert limit(pod_deadline=3600, retries=6) is None
    assert limit(job_deadline=7200, pod_deadline=3600, retries=6) == 7200.0
    assert limit(job_deadline=0) is None and limit(job_deadline="7200") is None
    assert limit(job_deadline=10**12) is None  # past what the wire takes: none
    bare = pod("p", node_name="n1")
    bare["spec"]["activeDeadlineSeconds"] = 600
    (group,) = group_pods([bare], {}).values()
    report = job_report(group, CONTEXT)
    assert report is not None and report.time_limit_s == 600.0


def test_kueues_maximum_execution_time_is_a_time_limit_less_what_ran_before() -> None:
    pods = [pod(f"j-a-{i}", owner=("Job", "j-a"), node_name="n1", gpus=4) for i in range(2)]
    owner = job("j-a")

    def limit(max_exec: object, past: object = None, deadline: int | None = None) -> Any:
        admitted = copy.deepcopy(ADMITTED)
        if max_exec is not None:
            admitted["spec"]["maximumExecutionTimeSeconds"] = max_exec
        if past is not None:
            admitted["status"]["accumulatedPastExecutionTimeSeconds"] = past
        obj = copy.deepcopy(owner)
        if deadline is not None:
            obj["spec"]["activeDeadlineSeconds"] = deadline
        report = workload_report(
            admitted, JobGroup(OwnerRef("Job", "ml", "j-a"), obj, pods), CONTEXT, QUEUES
        )
        assert report is not None
        return report.time_limit_s

    assert limit(None) is None
    assert limit(7200) == 7200.0
    assert limit(7200, past=3000) == 4200.0  # an earlier admission ran 3000 s of it
    assert limit(7200, past=9000) == 1.0  # spent: deactivated any moment
    assert limit(7200, deadline=3600) == 3600.0  # the Job's own deadline comes first
    assert limit(0) is None and limit("7200") is None
