"""Kubernetes Nodes → ``NodeReport``: GPUs, their model, CPU, memory, state and labels.

* **GPUs**: ``status.allocatable["nvidia.com/gpu"]`` (what pods can be given; capacity less
  what the device plugin marks unhealthy). A node never reports fewer GPUs than its pods
  hold: when the device plugin restarts, allocatable drops to 0 for a moment while the
  pods keep their GPUs, and a count below what is held is not a possible cluster.
* **Model**: NVIDIA GPU feature discovery's ``nvidia.com/gpu.product`` (e.g.
  ``NVIDIA-H100-80GB-HBM3``) and ``nvidia.com/gpu.memory`` (MiB) → a model name of the
  control plane's catalogue (:func:`gpu_model_name`): an explicit alias from the
  connector's options first, then the known families (H200, H100, A100-80G/-40G by
  memory, L40S, A10, V100, T4, P100), else the product less its ``NVIDIA-`` prefix. A
  node with GPUs and no product label gets ``default_gpu_model``.
* **MIG**: with GFD's ``single`` strategy every ``nvidia.com/gpu`` is a MIG slice and the
  product ends ``-MIG-<profile>``: the model is ``<model>-MIG-<profile>`` (a site adds it
  to its catalogue). With ``mixed``, ``nvidia.com/gpu`` counts whole GPUs only and the
  slices are other resources (``nvidia.com/mig-1g.10gb``). Either way the GFD labels
  (``nvidia.com/mig.*``, ``nvidia.com/mig-<profile>.count``) are kept in ``labels``, and
  every allocatable extended resource (a name with a ``/``, other than
  ``nvidia.com/gpu``) is added as the label ``shaper.io/allocatable.<resource>``.
* **State**: the Ready condition False or Unknown (the kubelet stopped reporting) →
  ``down``; cordoned (``spec.unschedulable``) or tainted NoSchedule/NoExecute → ``draining``
  (a draining node still runs what it has). Taints whose key is in ``ignored_taints``
  (default ``nvidia.com/gpu``, ``amd.com/gpu``: "GPU pods only" taints that sites put on
  every GPU node) do not count.
* **Labels**: all of them, up to NodeReport's 256; GPU labels and Shaper's own first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from wire.telemetry import NodeReport, NodeState

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
PRODUCT_PREFIX = "NVIDIA-"  # of GFD's product labels (NVIDIA-H100-80GB-HBM3)
MEMORY_LABEL = "nvidia.com/gpu.memory"
ALLOCATABLE_LABEL_PREFIX = "shaper.io/allocatable."
MAX_LABELS = 256
MAX_LABEL_VALUE = 255
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_MIG_SUFFIX = re.compile(r"-MIG-(?P<profile>[0-9a-z.+]+)$", re.IGNORECASE)
# Product substrings → catalogue names, most specific first.
_FAMILIES: tuple[tuple[str, str], ...] = (
    ("GH200", "H200"),
    ("H200", "H200"),
    ("H100", "H100"),
    ("H800", "H100"),
    ("L40S", "L40S"),
    ("A10G", "A10"),
    ("A10-", "A10"),
    ("V100", "V100"),
    ("T4", "T4"),
    ("P100", "P100"),
)


def quantity(value: object) -> Decimal:
    """A resource quantity ("8", "500m", "1Ti"); 0 when unparseable, for a bad value on one
    object must not stop the telemetry of the whole cluster."""
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return Decimal(0)


def whole(value: object) -> int:
    """A count of devices (GPUs): whole, never negative."""
    # Extended resources are whole numbers, almost always written as plain digits: those
    # skip the Decimal parse, which was a third of translating 10,000 pods.
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return max(0, int(quantity(value)))


def memory_mib(value: object) -> int:
    return max(0, int(quantity(value) / (1024 * 1024)))


def gpu_model_name(
    product: str,
    memory_mib_label: str | None,
    *,
    aliases: Mapping[str, str],
) -> str:
    """The catalogue name of a GFD product label (see the module docstring)."""
    if product in aliases:
        return aliases[product]
    mig = _MIG_SUFFIX.search(product)
    base = product[: mig.start()] if mig else product
    if base in aliases:
        model = aliases[base]
    else:
        model = _family(base, memory_mib_label)
    if mig:
        model = f"{model}-MIG-{mig.group('profile')}"
    return model[:64]


def _family(product: str, memory_mib_label: str | None) -> str:
    upper = product.upper()
    if "A100" in upper:
        memory = int(memory_mib_label) if memory_mib_label and memory_mib_label.isdigit() else 0
        return "A100-80G" if "80GB" in upper or memory > 60_000 else "A100-40G"
    padded = upper + "-"
    for marker, model in _FAMILIES:
        if marker in padded:
            return model
    return product.removeprefix(PRODUCT_PREFIX)


def node_state(node: Mapping[str, Any], *, ignored_taints: Iterable[str]) -> NodeState:
    status = node.get("status") or {}
    ready = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    if ready is None or ready.get("status") != "True":
        return NodeState.down
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return NodeState.draining
    ignored = set(ignored_taints)
    for taint in spec.get("taints") or []:
        if taint.get("effect") in _BLOCKING_EFFECTS and taint.get("key") not in ignored:
            return NodeState.draining
    return NodeState.up


def node_gpus(node: Mapping[str, Any]) -> int:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return whole(allocatable.get(GPU_RESOURCE, "0"))


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    metadata = node.get("metadata") or {}
    labels: dict[str, str] = {
        key: value[:MAX_LABEL_VALUE] for key, value in (metadata.get("labels") or {}).items()
    }
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for resource, amount in allocatable.items():
        if "/" in resource and resource != GPU_RESOURCE:
            labels[ALLOCATABLE_LABEL_PREFIX + resource] = str(amount)[:MAX_LABEL_VALUE]
    if len(labels) <= MAX_LABELS:
        return labels

    def rank(key: str) -> tuple[int, str]:
        first = key.startswith(("nvidia.com/", "shaper.io/", "amd.com/"))
        return (0 if first else 1, key)

    return {key: labels[key] for key in sorted(labels, key=rank)[:MAX_LABELS]}


def node_report(
    node: Mapping[str, Any],
    *,
    gpus_held: int = 0,
    aliases: Mapping[str, str],
    default_gpu_model: str,
    ignored_taints: Iterable[str],
) -> NodeReport:
    """One Node as a ``NodeReport``; ``gpus_held``: GPUs its bound pods request."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpu_count = max(node_gpus(node), gpus_held)
    model = None
    if gpu_count:
        product = labels.get(PRODUCT_LABEL)
        model = (
            gpu_model_name(product, labels.get(MEMORY_LABEL), aliases=aliases)
            if product
            else default_gpu_model
        )
    return NodeReport(
        name=metadata["name"],
        gpu_model=model,
        gpu_count=gpu_count,
        cpu_cores=max(0, int(quantity(allocatable.get("cpu", "0")))),
        memory_mib=memory_mib(allocatable.get("memory", "0")),
        labels=node_labels(node),
        state=node_state(node, ignored_taints=ignored_taints),
    )


def _without_heartbeat(node: Mapping[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in (node.get("metadata") or {}).items() if k != "resourceVersion"}
    status = dict(node.get("status") or {})
    status["conditions"] = [
        {k: v for k, v in c.items() if k != "lastHeartbeatTime"}
        for c in status.get("conditions") or []
    ]
    return {**node, "metadata": metadata, "status": status}


def node_change_matters(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """False for a kubelet's (kwok's) heartbeat, which only moves condition heartbeat times:
    with 1,000 nodes those would wake the telemetry push many times a second."""
    if old is None or new is None:
        return True
    return _without_heartbeat(old) != _without_heartbeat(new)
