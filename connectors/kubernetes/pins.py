"""A node pin Shaper sets on a Job lasts one run.

A Job that a plan started or moved onto chosen nodes carries them in its pod template's
required node affinity (``kubernetes.io/hostname In …``: connectors.kubernetes.actions,
connectors.kubernetes.moves), and a template keeps what it is given: when a pod of that run
fails or is deleted (its node failed, it was evicted), the Job controller creates the next
pod from the same template, held to those nodes — on a node that is gone or full it stays
Pending for good, and Shaper's snapshot, which reads a pending Job's pin as the nodes it
must run on, would plan it nowhere else.

So every pin Shaper writes is stamped on the Job (annotation ``shaper.io/pin``, JSON):
``failed``, the Job's ``status.failed`` when it was pinned; ``nodes``, the nodes pinned;
``affinity``, the template's affinity before Shaper's first pin (a pin replaces a pin, the
Job's own stays recorded); and ``started``, which the connector's upkeep sets once it sees
a pod of the pinned run on a node. Measured on Kubernetes 1.37: a deleted or failed pod
raises ``status.failed``, a suspension does not; a failure a ``podFailurePolicy`` ignores
(``DisruptionTarget``: a node's taint eviction) does not raise it either, hence
``started``. A pin is *stale* once the count has passed the stamp's, or the run started,
while the template still pins those nodes (an operator's edit since is theirs, not
Shaper's) and does not resume from checkpoint images (they are on one node: the pin is
where the process can be restored, so it stays — until that node leaves the cluster,
connectors.kubernetes.actions.lost_images_node). A pending Job's stale pin is reported
as the Job's own nodes (:func:`stale_pin_nodes`), and the upkeep gives the template its
own affinity back once the Job's pods cannot be scheduled
(connectors.kubernetes.actions.lift_stale_pin) — or, for a gang, once its pinned run lost a
pod whose replacement finds no node while the others run (actions.gang_stranded): such a
gang cannot go on as it is, so its running pods are stopped too where that loses no
work (an elastic training job, which resumes from its own checkpoint: actions.gang_blocker).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from wire.checkpoint_image import POINTER_PREFIX, read_pointer

PIN_ANNOTATION = "shaper.io/pin"
# On a Job while the connector lifts a stale pin of Shaper's
# (connectors.kubernetes.actions.lift_stale_pin): a Job found suspended with it was
# suspended for that alone, and is let run again; a step that acts on the Job meanwhile
# takes the mark off.
LIFTING_PIN = "shaper.io/lifting-pin"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Where a Job's pods read their resume pointer (the contract: connectors.kubernetes.actions).
RESUME_FROM = "shaper.io/resume-from"
# The template label that sends a Job's pods to the restore webhook
# (connectors.kubernetes.restore_webhook): with a checkpoint image's pointer only.
RESTORE_LABEL = "shaper.io/restore"


@dataclass(frozen=True)
class Pin:
    """A stamp of one pin Shaper wrote on a Job's template."""

    failed: int  # the Job's status.failed when pinned
    nodes: tuple[str, ...]  # the nodes pinned (node_set)
    affinity: dict[str, Any] | None  # the template's affinity before Shaper's first pin
    started: bool = False  # a pod of the pinned run was seen on a node

    def encode(self) -> str:
        return json.dumps(
            {
                "failed": self.failed,
                "nodes": list(self.nodes),
                "affinity": self.affinity,
                "started": self.started,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    def in_force(self, template_spec: Mapping[str, Any]) -> bool:
        """Whether the template still pins the nodes this stamp says (not another pin, not
        an operator's edit made since)."""
        return node_set(affinity_nodes(template_spec.get("affinity"))) == self.nodes

    def stale(self, job: Mapping[str, Any]) -> bool:
        """Whether the pinned run began (a pod of it ran, or one failed since) while the
        template still pins its nodes and does not resume from checkpoint images: the pin
        should go. ``job``: the Job as JSON."""
        template = (job.get("spec") or {}).get("template") or {}
        pointer = ((template.get("metadata") or {}).get("annotations") or {}).get(RESUME_FROM)
        if isinstance(pointer, str) and pointer.startswith(POINTER_PREFIX):
            return False
        failed = (job.get("status") or {}).get("failed") or 0
        began = self.started or (isinstance(failed, int) and failed > self.failed)
        return began and self.in_force(template.get("spec") or {})

    def restored_spec(self, template_spec: Mapping[str, Any]) -> dict[str, Any]:
        """The template's pod spec with its own affinity back."""
        spec = dict(template_spec)
        if self.affinity is None:
            spec.pop("affinity", None)
        else:
            spec["affinity"] = self.affinity
        return spec


def read_pin(annotations: Mapping[str, Any] | None) -> Pin | None:
    """The stamp on a Job (its annotations); None when there is none or it is not one of
    ours (malformed: then nothing is lifted)."""
    raw = (annotations or {}).get(PIN_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    failed, nodes = body.get("failed"), body.get("nodes")
    affinity, started = body.get("affinity"), body.get("started", False)
    if (
        not isinstance(failed, int)
        or isinstance(failed, bool)
        or failed < 0
        or not isinstance(nodes, list)
        or not nodes
        or not all(isinstance(n, str) and n for n in nodes)
        or not (affinity is None or isinstance(affinity, dict))
        or not isinstance(started, bool)
    ):
        return None
    return Pin(failed, node_set(nodes), affinity, started)


def new_pin(
    *,
    annotations: Mapping[str, Any] | None,
    template_spec: Mapping[str, Any],
    failed: int,
    nodes: list[str],
) -> Pin:
    """The stamp of a pin about to be written on a Job whose annotations and template pod
    spec are those given: a pin of Shaper's still in force keeps its stamp's record of the
    template's affinity before it (a pin replaces a pin; the Job's own placement stays what
    it was); otherwise the template's affinity now is the Job's own."""
    earlier = read_pin(annotations)
    if earlier is not None and earlier.in_force(template_spec):
        return Pin(failed, node_set(nodes), earlier.affinity)
    return Pin(failed, node_set(nodes), template_spec.get("affinity"))


def stale_pin_nodes(job: Mapping[str, Any]) -> list[str] | None:
    """The nodes a pending Job must run on once Shaper's stale pin is lifted (its own: empty
    when it had none); None when the Job carries no stale pin of Shaper's. ``job``: JSON."""
    pin = read_pin((job.get("metadata") or {}).get("annotations"))
    if pin is None or not pin.stale(job):
        return None
    template_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return pinned_nodes(pin.restored_spec(template_spec))


def images_node(template: Mapping[str, Any]) -> str | None:
    """The node whose checkpoint images a Job's pod template resumes from (its
    ``shaper.io/resume-from`` pointer, wire.checkpoint_image): the restore webhook holds
    every pod the template makes to that node (connectors.kubernetes.restore_webhook).
    None for any other pointer, none, or a malformed one (the webhook refuses its pods, and
    says why)."""
    pointer = ((template.get("metadata") or {}).get("annotations") or {}).get(RESUME_FROM)
    try:
        restore = read_pointer(pointer if isinstance(pointer, str) else None)
    except ValueError:
        return None
    return restore.node if restore is not None else None


def node_set(nodes: Iterable[str]) -> tuple[str, ...]:
    """Nodes as a pin holds them: sorted, each once (a plan may name a node per pod)."""
    return tuple(sorted(set(nodes)))


def affinity_nodes(affinity: Mapping[str, Any] | None) -> list[str]:
    """The nodes a required node affinity pins to by hostname (empty: not pinned)."""
    return pinned_nodes({"affinity": affinity} if affinity else {})


def pinned_nodes(spec: Mapping[str, Any]) -> list[str]:
    """The nodes a pod spec is pinned to by hostname (empty: not pinned)."""
    selected = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    if selected:
        return [selected]
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    nodes: list[str] = []
    for term in required:  # terms are ORed: every one must pin for the pod to be pinned
        term_nodes = [
            value
            for requirement in [
                *((r, "key") for r in term.get("matchExpressions") or []),
                *((r, "field") for r in term.get("matchFields") or []),
            ]
            for value in _pinning_values(*requirement)
        ]
        if not term_nodes:
            return []
        nodes.extend(term_nodes)
    return sorted(set(nodes))


def _pinning_values(requirement: Mapping[str, Any], where: str) -> list[str]:
    key = requirement.get("key")
    pinning = HOSTNAME_LABEL if where == "key" else "metadata.name"
    if key == pinning and requirement.get("operator") == "In":
        return [str(v) for v in requirement.get("values") or []]
    return []
