"""The Kubernetes and Kueue connectors' incremental ``read_state`` equals the whole
translation (``rebuild_state``) after any sequence of informer events: random ADDED,
MODIFIED and DELETED events and re-lists over every watched collection, on dict fixtures
shaped as kube-apiserver and Kueue serve them — no cluster. The events go through the
informers' own ``_apply`` and ``_replace``, as their watch and list loops apply them."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient

from connectors.kubernetes import KubernetesConnector, KubernetesConnectorConfig
from connectors.kubernetes.informer import Informer, Key, Object
from connectors.kueue.connector import KueueConnector

NAMESPACES = ("ml", "serve")
NODES = [f"n{i}" for i in range(6)]
PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", None]
CLOCK = datetime(2026, 12, 3, 10, 30, tzinfo=UTC)


def _time(rng: random.Random) -> str:
    return f"2026-12-03T10:{rng.randrange(60):02d}:00Z"


def _conditions(rng: random.Random, kinds: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "type": kind,
            "status": rng.choice(["True", "False"]),
            "reason": rng.choice(["Failed", "Succeeded", "Pending"]),
            "message": rng.choice(["", f"{kind} says so"]),
            "lastTransitionTime": _time(rng),
        }
        for kind in rng.sample(kinds, rng.randrange(len(kinds) + 1))
    ]


def _pod_spec(rng: random.Random) -> dict[str, Any]:
    gpus = str(rng.choice([0, 1, 2]))
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "resources": {rng.choice(["requests", "limits"]): {"nvidia.com/gpu": gpus}},
            }
        ]
    }
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"kubernetes.io/hostname": rng.choice(NODES)}
    if rng.random() < 0.3:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": rng.choice(PRODUCTS[:2])}
    if rng.random() < 0.3:
        spec["priorityClassName"] = rng.choice(["high", "low", "missing"])
    return spec


def _labels(rng: random.Random) -> dict[str, str]:
    labels = {}
    if rng.random() < 0.3:
        labels["shaper.io/team"] = rng.choice(["vision", "speech"])
    if rng.random() < 0.3:
        labels["shaper.io/kind"] = rng.choice(["training", "batch_inference", "nonsense"])
    if rng.random() < 0.2:
        labels["kueue.x-k8s.io/queue-name"] = "lq0"
    return labels


def node(rng: random.Random, name: str) -> Object:
    product = rng.choice(PRODUCTS)
    labels = {"nvidia.com/gpu.product": product} if product else {}
    spec: dict[str, Any] = {}
    if rng.random() < 0.2:
        spec["unschedulable"] = True
    if rng.random() < 0.2:
        spec["taints"] = [
            {"key": rng.choice(["nvidia.com/gpu", "maintenance"]), "effect": "NoSchedule"}
        ]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "64", "memory": "1Ti", "nvidia.com/gpu": rng.choice("048")},
            "conditions": [
                {
                    "type": "Ready",
                    "status": rng.choice(["True", "True", "False", "Unknown"]),
                    "lastHeartbeatTime": _time(rng),
                }
            ],
        },
    }


def pod(rng: random.Random, namespace: str, name: str) -> Object:
    metadata: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "labels": _labels(rng),
        "creationTimestamp": _time(rng),
    }
    owner = rng.choice(["job", "deployment", "statefulset", "jobset", "bare", "other"])
    if owner == "jobset":
        metadata["labels"]["jobset.sigs.k8s.io/jobset-name"] = rng.choice(["js0", "js1"])
    elif owner != "bare":
        kind, owner_name = {
            "job": ("Job", rng.choice(["j0", "j1", "j2"])),
            "deployment": ("ReplicaSet", "d0-5d8f"),
            "statefulset": ("StatefulSet", "s0"),
            "other": ("Workflow", "wf0"),
        }[owner]
        if owner == "deployment":
            metadata["labels"]["pod-template-hash"] = "5d8f"
        metadata["ownerReferences"] = [{"kind": kind, "name": owner_name, "controller": True}]
    spec = _pod_spec(rng)
    if rng.random() < 0.7:
        spec["nodeName"] = rng.choice([*NODES, "gone-node"])
    if rng.random() < 0.5:
        spec["priority"] = rng.choice([0, 100, 2_000_000])
    phase = rng.choice(["Pending", "Running", "Running", "Succeeded", "Failed"])
    status: dict[str, Any] = {"phase": phase, "startTime": _time(rng)}
    if rng.random() < 0.3:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "message": f"0/6 nodes ({name})"}
        ]
    if rng.random() < 0.3:
        status["containerStatuses"] = [{"name": "main", "restartCount": rng.randrange(3)}]
    return {"metadata": metadata, "spec": spec, "status": status}


def owner_object(rng: random.Random, kind: str, namespace: str, name: str) -> Object:
    template = {"metadata": {"labels": _labels(rng)}, "spec": _pod_spec(rng)}
    metadata: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "labels": _labels(rng),
        "creationTimestamp": _time(rng),
    }
    spec: dict[str, Any] = {"template": template}
    status: dict[str, Any] = {}
    if kind == "Job":
        spec.update(parallelism=rng.choice([1, 2, 4]), suspend=rng.random() < 0.3)
        if rng.random() < 0.5:
            spec["completions"] = rng.choice([1, 2])
        status["conditions"] = _conditions(rng, ["Complete", "Failed", "SuspendedX"])
        status["startTime"] = _time(rng)
    else:
        spec["replicas"] = rng.choice([0, 1, 2, 3])
        if rng.random() < 0.5:
            metadata["annotations"] = {
                "shaper.io/min-replicas": rng.choice(["1", "x"]),
                "shaper.io/max-replicas": "4",
            }
    return {"metadata": metadata, "spec": spec, "status": status}


def priority_class(rng: random.Random, name: str) -> Object:
    return {
        "metadata": {"name": name},
        "value": rng.choice([10, 1000, 5_000_000]),
        "globalDefault": rng.random() < 0.3,
    }


def workload(rng: random.Random, namespace: str, name: str) -> Object:
    owner = rng.choice(["j0", "j1", "j2", "j9"])  # j9: a Job with no pods nor object
    status: dict[str, Any] = {
        "conditions": _conditions(
            rng, ["QuotaReserved", "Admitted", "Evicted", "Preempted", "Finished"]
        )
    }
    if rng.random() < 0.4:
        status["admission"] = {
            "clusterQueue": "cq0",
            "podSetAssignments": [{"flavors": {"nvidia.com/gpu": rng.choice(["f0", "f1"])}}],
        }
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "ownerReferences": [{"kind": "Job", "name": owner, "controller": True}],
            "creationTimestamp": _time(rng),
        },
        "spec": {
            "active": rng.random() < 0.8,
            "priority": rng.choice([0, 50, 2_000_000]),
            "queueName": rng.choice(["lq0", "lq1", ""]),
            "podSets": [{"count": rng.choice([1, 2]), "template": {"spec": _pod_spec(rng)}}],
        },
        "status": status,
    }


def kueue_object(rng: random.Random, collection: str, name: str) -> Object:
    if collection == "localqueues":
        return {
            "metadata": {"namespace": rng.choice(NAMESPACES), "name": name},
            "spec": {"clusterQueue": rng.choice(["cq0", "cq1"])},
        }
    if collection == "clusterqueues":
        return {
            "metadata": {"name": name},
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "nvidia.com/gpu"],
                        "flavors": [{"name": f} for f in rng.sample(["f0", "f1"], 2)],
                    }
                ]
            },
        }
    product = rng.choice(PRODUCTS)
    return {
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": product} if product else {}},
    }


def make_object(rng: random.Random, collection: str) -> Object:
    """A random object of a collection, from a small set of keys so events collide."""
    namespace = rng.choice(NAMESPACES)
    if collection == "nodes":
        return node(rng, rng.choice(NODES))
    if collection == "pods":
        return pod(rng, namespace, f"p{rng.randrange(14)}")
    if collection in ("jobs", "deployments", "statefulsets"):
        kind, names = {
            "jobs": ("Job", ["j0", "j1", "j2"]),
            "deployments": ("Deployment", ["d0", "d1"]),
            "statefulsets": ("StatefulSet", ["s0"]),
        }[collection]
        return owner_object(rng, kind, namespace, rng.choice(names))
    if collection == "priorityclasses":
        return priority_class(rng, rng.choice(["high", "low"]))
    if collection == "workloads":
        return workload(rng, namespace, f"w{rng.randrange(4)}")
    queue_names = {"localqueues": ["lq0", "lq1"], "clusterqueues": ["cq0", "cq1"]}
    return kueue_object(rng, collection, rng.choice(queue_names.get(collection, ["f0", "f1"])))


def _key(obj: Object) -> Key:
    return obj["metadata"].get("namespace"), obj["metadata"]["name"]


def relist(rng: random.Random, informer: Informer, collection: str) -> None:
    """A list replacing the cache: some objects kept, some changed, some new, some gone."""
    objects: dict[Key, Object] = {}
    for key, obj in list(informer._objects.items()):
        if rng.random() < 0.6:
            objects[key] = obj
    for _ in range(rng.randrange(6)):
        obj = make_object(rng, collection)
        objects[_key(obj)] = obj
    informer._replace(dict(sorted(objects.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))), "1")


def step(rng: random.Random, connector: KubernetesConnector) -> None:
    weights = {"pods": 8, "nodes": 3, "jobs": 3, "deployments": 2, "workloads": 3}
    names = list(connector.informers)
    collection = rng.choices(names, weights=[weights.get(n, 1) for n in names])[0]
    informer = connector.informers[collection]
    if rng.random() < 0.03:
        relist(rng, informer, collection)
        return
    existing = informer.items()
    if existing and rng.random() < 0.2:
        informer._apply({"type": "DELETED", "object": rng.choice(existing)})
        return
    obj = make_object(rng, collection)
    kind = "MODIFIED" if informer.get(*_key(obj)) is not None else "ADDED"
    informer._apply({"type": kind, "object": obj})


def connector_of(kind: str, **options: Any) -> KubernetesConnector:
    config = KubernetesConnectorConfig(cluster="c", **options)
    make = KueueConnector if kind == "kueue" else KubernetesConnector
    connector = make(config, api=ApiClient(), clock=lambda: CLOCK, start=False)
    for informer in connector.informers.values():
        informer._replace({}, "1")
        informer.error = None
        informer._synced.set()
    return connector


OPTIONS: list[dict[str, Any]] = [
    {},
    {"namespaces": ["ml"]},
    {"include_cpu_only": True, "ignored_taints": []},
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", ["kubernetes", "kueue"])
@pytest.mark.parametrize("options", range(len(OPTIONS)))
def test_incremental_read_state_equals_a_whole_translation(
    seed: int, kind: str, options: int
) -> None:
    rng = random.Random(f"{seed}-{kind}-{options}")
    connector = connector_of(kind, **OPTIONS[options])
    reports = 0
    for i in range(400):
        step(rng, connector)
        if rng.random() < 0.15 or i == 399:
            incremental = connector.read_state()
            assert incremental == connector.rebuild_state(), f"after event {i}"
            reports += len(incremental.jobs)
    assert reports > 0
    # A connector that lists the final caches afresh agrees too: the reports depend on the
    # objects, not on the history of events that made them.
    fresh = connector_of(kind, **OPTIONS[options])
    for name, informer in connector.informers.items():
        fresh.informers[name]._replace(dict(informer._objects), "2")
    assert fresh.read_state() == connector.read_state()


def test_a_failed_translation_starts_over_from_the_whole_caches() -> None:
    rng = random.Random(7)
    connector = connector_of("kubernetes")
    for _ in range(100):
        step(rng, connector)
    connector.read_state()
    pods = connector.informers["pods"]
    broken = pod(rng, "ml", "broken")
    broken["spec"]["containers"] = "not a list"
    pods._apply({"type": "ADDED", "object": broken})
    with pytest.raises(AttributeError):
        connector.read_state()
    pods._apply({"type": "DELETED", "object": broken})
    for _ in range(50):
        step(rng, connector)
    assert connector.read_state() == connector.rebuild_state()
