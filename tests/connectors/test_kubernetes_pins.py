"""The stamps that make Shaper's pins on Kubernetes Jobs last one run
(connectors.kubernetes.pins), and the tests of pods that cannot be placed
(connectors.kubernetes.actions.pods_stranded, gang_stranded). The real control plane's
side: tests/k8s/test_kubernetes_pins.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from connectors.kubernetes.actions import (
    Judged,
    gang_blocker,
    gang_stranded,
    job_stopped,
    judge_lift,
    lost_images_node,
    pods_stranded,
)
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
    created: str = "2026-12-07T10:00:00Z",
    since: str = "2026-12-07T10:00:00Z",
    nominated: str | None = None,
) -> dict[str, Any]:
    """A pod as JSON; ``since``: when the scheduler last found no node for it."""
    metadata: dict[str, Any] = {"name": "train-x", "creationTimestamp": created}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    conditions = (
        [{"type": "PodScheduled", "status": "False", "reason": reason, "lastTransitionTime": since}]
        if reason
        else []
    )
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": status}


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


# A gang of two pinned to n2 and n3, resumed (its run began) at 10:00; it is 10:05.
GANG = Pin(0, ("n2", "n3"), None, started=True)
NOW = datetime(2026, 12, 7, 10, 5, tzinfo=UTC)
RUNNING = pod(node="n2", phase="Running", reason=None, created="2026-12-07T10:00:01Z")


def gang(*, failed: int = 0) -> dict[str, Any]:
    found = job(GANG, pinned=["n2", "n3"], failed=failed)
    found["status"]["startTime"] = "2026-12-07T10:00:00Z"
    return found


def test_a_gang_is_stranded_once_its_run_lost_a_pod_that_finds_no_node() -> None:
    waiting = pod(created="2026-12-07T10:02:00Z", since="2026-12-07T10:02:01Z")
    # The lost pod counted failed (deleted, or failed): its replacement has waited 3 min.
    assert gang_stranded(gang(failed=1), [RUNNING, waiting], GANG, for_s=60, now=NOW)
    # Not for long enough yet.
    assert not gang_stranded(gang(failed=1), [RUNNING, waiting], GANG, for_s=600, now=NOW)
    # A failure a podFailurePolicy ignores (not counted): the run's own pod ended Failed.
    ignored = pod(node="n3", phase="Failed", reason=None, created="2026-12-07T10:00:01Z")
    assert gang_stranded(gang(), [RUNNING, ignored, waiting], GANG, for_s=60, now=NOW)
    # A pod that failed in an earlier run (created before the Job last began) is not this
    # run's: a pod that waits for a pinned node the plan is freeing is not a lost one.
    earlier = pod(node="n3", phase="Failed", reason=None, created="2026-12-07T09:00:00Z")
    assert not gang_stranded(gang(), [RUNNING, earlier, waiting], GANG, for_s=60, now=NOW)
    assert not gang_stranded(gang(), [RUNNING, waiting], GANG, for_s=60, now=NOW)


def test_a_first_pod_waiting_for_a_node_being_freed_is_no_replacement() -> None:
    """The run's first pods are made when it begins: one waits for a pinned node the plan
    is still freeing; another pod's failure since does not make the wait a strand."""
    first = pod(created="2026-12-07T10:00:00Z", since="2026-12-07T10:00:01Z")
    replaced = pod(node="n2", phase="Running", reason=None, created="2026-12-07T10:03:00Z")
    assert not gang_stranded(gang(failed=1), [replaced, first], GANG, for_s=60, now=NOW)


def elastic(found: dict[str, Any], *, checkpointable: bool = True) -> dict[str, Any]:
    """``found`` made an elastic training job: an elastic Indexed Job with Shaper's range."""
    found["metadata"]["annotations"]["shaper.io/max-replicas"] = "4"
    found["spec"].update(completionMode="Indexed", completions=2, parallelism=2)
    template = found["spec"]["template"]
    if checkpointable:
        template["metadata"]["annotations"]["shaper.io/checkpointable"] = "true"
        env = {"fieldRef": {"fieldPath": "metadata.annotations['shaper.io/resume-from']"}}
        template["spec"]["containers"] = [
            {"name": "train", "env": [{"name": "SHAPER_RESUME_FROM", "valueFrom": env}]}
        ]
    return found


def test_only_an_elastic_training_gang_is_stopped_to_lift_its_pin() -> None:
    """Its pods resume from its own checkpoint; any other Job's from the move's pointer,
    older than the work they did since. Elastic as the telemetry reports one
    (pods.training_range)."""
    pods = [RUNNING]
    assert gang_blocker(elastic(gang()), pods) is None
    on_template = elastic(gang())
    on_template["metadata"]["annotations"].pop("shaper.io/max-replicas")
    on_template["spec"]["template"]["metadata"]["annotations"]["shaper.io/max-replicas"] = "4"
    assert gang_blocker(on_template, pods) is None
    rigid = elastic(gang())
    rigid["metadata"]["annotations"].pop("shaper.io/max-replicas")
    fixed = elastic(gang())
    fixed["metadata"]["annotations"].update({"shaper.io/min-replicas": "4"})
    managed = elastic(gang())
    managed["spec"]["managedBy"] = "example.com/another-controller"
    per_index = elastic(gang())
    per_index["spec"]["backoffLimitPerIndex"] = 1
    for job_json in (rigid, fixed, managed, per_index):
        blocker = gang_blocker(job_json, pods) or ""
        assert "only an elastic training job resumes from its own" in blocker, job_json
    assert "not checkpointable" in (gang_blocker(elastic(gang(), checkpointable=False), pods) or "")


def test_a_gang_is_not_stranded_while_a_node_is_nominated_or_none_of_it_runs() -> None:
    nominated = pod(created="2026-12-07T10:02:00Z", since="2026-12-07T10:02:01Z", nominated="n3")
    assert not gang_stranded(gang(failed=1), [RUNNING, nominated], GANG, for_s=60, now=NOW)
    # None of it runs: the whole Job's rule (pods_stranded), not the gang's.
    waiting = pod(since="2026-12-07T10:02:01Z")
    assert not gang_stranded(gang(failed=1), [waiting, waiting], GANG, for_s=60, now=NOW)
    assert pods_stranded([waiting, waiting])
    # Every pod placed: nothing waits.
    placed = pod(node="n3", phase="Running", reason=None)
    assert not gang_stranded(gang(failed=1), [RUNNING, placed], GANG, for_s=60, now=NOW)


def test_checkpoint_images_are_lost_only_with_a_node_gone_from_a_known_cluster() -> None:
    images = POINTER_PREFIX + '{"node": "n2", "images": {"train": "localhost/ckpt:1"}}'
    pinned = job(Pin(0, ("n2",), None), pinned=["n2"], pointer=images)
    assert lost_images_node(pinned, {"n1", "n3"}) == "n2"
    assert lost_images_node(pinned, {"n1", "n2"}) is None  # down perhaps, but there
    assert lost_images_node(pinned, None) is None  # the node list is not known yet
    assert lost_images_node(pinned, set()) is None
    own = job(Pin(0, ("n2",), None), pinned=["n2"], pointer="/shared/ckpt/7")
    assert lost_images_node(own, {"n1"}) is None  # a pointer the workload reads itself
    broken = job(Pin(0, ("n2",), None), pinned=["n2"], pointer=POINTER_PREFIX + "{")
    assert lost_images_node(broken, {"n1"}) is None


def test_one_judgement_says_which_lift_and_leaves_jobs_others_run() -> None:
    """judge_lift: what the upkeep queues from its caches and the lift checks again."""
    stale = Pin(0, ("n2",), None, started=True)
    waiting = [pod()]
    assert judge_lift(job(stale, pinned=["n2"]), waiting, known_nodes=None).mark == "true"
    images = POINTER_PREFIX + '{"node": "n2", "images": {"train": "localhost/ckpt:1"}}'
    lost = job(stale, pinned=["n2"], pointer=images)
    assert judge_lift(lost, waiting, known_nodes={"n1"}).mark == "images lost with node n2"
    assert judge_lift(lost, waiting, known_nodes={"n1", "n2"}).mark is None
    for other in ({"suspend": True}, {"managedBy": "example.com/mine"}):
        held = job(stale, pinned=["n2"])
        held["spec"].update(other)
        assert judge_lift(held, waiting, known_nodes=None) == Judged()
    kueue = job(stale, pinned=["n2"])
    kueue["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    assert judge_lift(kueue, waiting, known_nodes=None) == Judged()
    # Held (suspended): nothing runs, so only a pointer to images gone with their node is
    # judged, at once (no pod has to wait first); a stale pin waits for the start.
    held = job(stale, pinned=["n2"], pointer=images)
    held["spec"]["suspend"] = True
    assert judge_lift(held, [], known_nodes={"n1"}).mark == "images lost with node n2"
    assert judge_lift(held, [], known_nodes={"n1", "n2"}) == Judged()
    kueue["spec"]["suspend"] = True
    kueue["spec"]["template"]["metadata"] = {"annotations": {"shaper.io/resume-from": images}}
    assert judge_lift(kueue, [], known_nodes={"n1"}) == Judged()  # Kueue's to let run
    # A rigid gang stranded on its stale pin: left, and why.
    rigid = elastic(gang(failed=1))
    rigid["metadata"]["annotations"].pop("shaper.io/max-replicas")
    replaced = pod(created="2026-12-07T10:02:00Z", since="2026-12-07T10:02:01Z")
    judged = judge_lift(rigid, [RUNNING, replaced], known_nodes=None, gang_stranded_s=60, now=NOW)
    assert judged.mark is None and "only an elastic training job" in (judged.blocked or "")
    judged = judge_lift(
        elastic(gang(failed=1)), [RUNNING, replaced], known_nodes=None, gang_stranded_s=60, now=NOW
    )
    assert judged == Judged("stopped 1 running pod(s) of its gang, which lost a pod")


def test_a_job_is_stopped_once_its_controller_says_suspended_and_no_pod_is_active() -> None:
    """job_stopped: what the lifts wait for before they change a suspended Job's template."""
    suspended = {"type": "Suspended", "status": "True"}
    assert job_stopped({"status": {"conditions": [suspended]}})
    assert not job_stopped({"status": {"conditions": [suspended], "active": 1}})
    assert not job_stopped({"status": {"conditions": [{**suspended, "status": "False"}]}})
    assert not job_stopped({"spec": {"suspend": True}, "status": {}})  # not seen yet
