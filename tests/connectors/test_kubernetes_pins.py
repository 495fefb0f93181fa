"""The stamps that make Shaper's pins on Kubernetes Jobs last one run
(connectors.kubernetes.pins), and the test of pods that cannot be placed
(connectors.kubernetes.actions.pods_stranded). The real control plane's side:
tests/k8s/test_kubernetes_pins.py."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.kubernetes.actions import pods_stranded
from connectors.kubernetes.pins import (
    PIN_ANNOTATION,
    RESUME_FROM,
    Pin,
    new_pin,
    read_pin,
    stale_pin_nodes,
)
from connectors.kubernetes.submission import pinned_affinity
from wire.checkpoint_image import POINTER_PREFIX

ZONE = {"key": "zone", "operator": "In", "values": ["z1"]}
OWN = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        ZONE,
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]},
                    ]
                }
            ]
        }
    }
}


def job(
    pin: Pin | None, *, pinned: list[str], failed: int = 0, pointer: str | None = None
) -> dict[str, Any]:
    """A Job as JSON whose template pins ``pinned`` (over its own affinity ``OWN``)."""
    annotations = {PIN_ANNOTATION: pin.encode()} if pin else {}
    template_annotations = {RESUME_FROM: pointer} if pointer else {}
    return {
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations},
        "spec": {
            "template": {
                "metadata": {"annotations": template_annotations},
                "spec": {"affinity": pinned_affinity(OWN, pinned), "containers": []},
            }
        },
        "status": {"failed": failed} if failed else {},
    }


def test_a_stamp_reads_back_as_written() -> None:
    pin = Pin(2, ("n2", "n3"), OWN, started=True)
    assert read_pin({PIN_ANNOTATION: pin.encode()}) == pin
    assert read_pin({PIN_ANNOTATION: Pin(0, ("n2",), None).encode()}) == Pin(0, ("n2",), None)


@pytest.mark.parametrize(
    "raw",
    [
        "shaper-pin:0::n2",
        "[]",
        '{"failed": true, "nodes": ["n2"], "affinity": null}',
        '{"failed": -1, "nodes": ["n2"], "affinity": null}',
        '{"failed": 0, "nodes": [], "affinity": null}',
        '{"failed": 0, "nodes": [""], "affinity": null}',
        '{"failed": 0, "nodes": ["n2"], "affinity": []}',
        '{"failed": 0, "nodes": ["n2"], "affinity": null, "started": "yes"}',
    ],
)
def test_a_stamp_not_of_ours_is_none_and_nothing_is_lifted_for_it(raw: str) -> None:
    assert read_pin({PIN_ANNOTATION: raw}) is None
    found = job(None, pinned=["n2"], failed=3)
    found["metadata"]["annotations"][PIN_ANNOTATION] = raw
    assert stale_pin_nodes(found) is None


def test_a_pin_over_a_pin_of_shapers_keeps_the_jobs_own_affinity() -> None:
    first = new_pin(annotations={}, template_spec={"affinity": OWN}, failed=0, nodes=["n2"])
    assert first == Pin(0, ("n2",), OWN)
    moved = job(first, pinned=["n2"], failed=1)
    second = new_pin(
        annotations=moved["metadata"]["annotations"],
        template_spec=moved["spec"]["template"]["spec"],
        failed=1,
        nodes=["n3", "n4"],
    )
    assert second == Pin(1, ("n3", "n4"), OWN)


def test_a_pin_over_a_template_edited_since_takes_the_edit_for_the_jobs_own() -> None:
    stamped = job(Pin(0, ("n2",), OWN), pinned=["n5"])  # someone pinned n5 instead
    edited = stamped["spec"]["template"]["spec"]
    again = new_pin(
        annotations=stamped["metadata"]["annotations"], template_spec=edited, failed=0, nodes=["n3"]
    )
    assert again.affinity == edited["affinity"]


def test_a_pin_is_stale_once_its_run_began_and_reported_as_the_jobs_own_nodes() -> None:
    pin = Pin(1, ("n2",), OWN)
    assert stale_pin_nodes(job(pin, pinned=["n2"], failed=1)) is None  # the run is on
    assert stale_pin_nodes(job(pin, pinned=["n2"], failed=2)) == ["n1"]  # a pod failed since
    started = Pin(1, ("n2",), OWN, started=True)  # a pod ran; its failure was not counted
    assert stale_pin_nodes(job(started, pinned=["n2"], failed=1)) == ["n1"]
    # A Job that had no pin of its own is reported with none.
    assert stale_pin_nodes(job(Pin(0, ("n2",), None), pinned=["n2"], failed=1)) == []


def test_a_pin_edited_since_or_resuming_from_checkpoint_images_is_not_stale() -> None:
    pin = Pin(0, ("n2",), OWN, started=True)
    assert stale_pin_nodes(job(pin, pinned=["n3"], failed=4)) is None
    images = POINTER_PREFIX + '{"node": "n2", "images": {"train": "localhost/ckpt:1"}}'
    assert not pin.stale(job(pin, pinned=["n2"], failed=4, pointer=images))
    assert pin.stale(job(pin, pinned=["n2"], failed=4, pointer="/shared/ckpt/7"))


def pod(
    *,
    node: str | None = None,
    phase: str = "Pending",
    reason: str | None = "Unschedulable",
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "train-x"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    conditions = [{"type": "PodScheduled", "status": "False", "reason": reason}] if reason else []
    return {
        "metadata": metadata,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_pods_are_stranded_only_when_none_runs_and_the_scheduler_found_no_node() -> None:
    assert pods_stranded([pod()])
    assert pods_stranded([pod(), pod(reason=None)])
    assert not pods_stranded([])  # between a failed pod and its replacement
    assert not pods_stranded([pod(reason=None)])  # not tried yet
    assert not pods_stranded([pod(reason="SchedulingGated")])  # the placement gate's
    assert not pods_stranded([pod(), pod(node="n3", phase="Running", reason=None)])
    assert not pods_stranded([pod(deleting=True)])
    assert not pods_stranded([pod(phase="Failed")])


def test_a_plan_naming_a_node_per_pod_pins_each_node_once() -> None:
    pin = new_pin(annotations={}, template_spec={}, failed=0, nodes=["n3", "n2", "n3"])
    assert pin.nodes == ("n2", "n3")
    assert pin.in_force({"affinity": pinned_affinity(None, ["n3", "n2", "n3"])})
