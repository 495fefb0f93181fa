"""connectors.kubernetes.submission without an API server: what a Job's spec leaves out,
the moved Job's name, and the Job a spec becomes (the real API server's side is in
tests/k8s/test_kubernetes_moves.py and test_kueue_moves.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from connectors.base import ConnectorError
from connectors.kubernetes.pins import LIFTING_PIN, PIN_ANNOTATION, Pin, read_pin
from connectors.kubernetes.pods import HOSTNAME_LABEL, QUEUE_LABEL, RESUME_FROM, STOPPED_BY_STEP
from connectors.kubernetes.submission import (
    MOVE_MARK,
    clean_job,
    job_from_spec,
    job_submit_spec,
    moved_job_name,
    pinned_affinity,
    unpinned,
)
from wire.telemetry import MAX_SUBMIT_SPEC, SchedulerKind, SubmitSpec

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def served_job() -> dict[str, Any]:
    """A Job as the API server serves it after the Job controller, Kueue and a Shaper move
    had their way with it."""
    uid = "0b6a2c1e-5f5e-4c11-9a57-1f1d5b6c7d8e"
    generated = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
    names = {"batch.kubernetes.io/job-name": "train", "job-name": "train"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": uid,
            "resourceVersion": "812",
            "generation": 3,
            "creationTimestamp": "2026-12-04T03:00:00Z",
            "managedFields": [{"manager": "kube-controller-manager"}],
            "ownerReferences": [{"kind": "Workflow", "name": "w"}],
            "labels": {
                QUEUE_LABEL: "team-a",
                "kueue.x-k8s.io/prebuilt-workload-name": "wl-of-cluster-a",
                "shaper.io/team": "vision",
                **generated,
                **names,
            },
            "annotations": {
                "example.com/owner": "ada",
                STOPPED_BY_STEP: "step-9",
                MOVE_MARK: "shaper-3-earlier-move",
                PIN_ANNOTATION: Pin(4, ("node-7",), None, started=True).encode(),
                LIFTING_PIN: "true",
            },
        },
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "suspend": True,
            "managedBy": "kueue.x-k8s.io/multikueue",
            "selector": {"matchLabels": generated},
            "template": {
                "metadata": {
                    "labels": {
                        **generated,
                        **names,
                        "kueue.x-k8s.io/podset": "main",
                        "shaper.io/restore": "checkpoint-image",  # with the pointer only
                        "app": "t",
                    },
                    "annotations": {RESUME_FROM: "/ckpt/a", "shaper.io/checkpointable": "true"},
                },
                "spec": {
                    "nodeName": "node-7",
                    "nodeSelector": {HOSTNAME_LABEL: "node-7", "disk": "ssd"},
                    "affinity": pinned_affinity(
                        {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {"key": "zone", "operator": "In", "values": ["z1"]}
                                            ]
                                        }  # noqa: E501
                                    ]
                                }
                            },
                            "podAntiAffinity": {"x": 1},
                        },
                        ["node-7"],
                    ),
                    "restartPolicy": "Never",
                    "containers": [{"name": "train", "image": "registry.example/train:1"}],
                },
            },
        },
        "status": {"active": 2, "conditions": []},
    }


def test_a_served_job_is_cleaned_of_what_only_its_cluster_means() -> None:
    cleaned = clean_job(served_job())
    assert cleaned["metadata"] == {
        "name": "train",
        "namespace": "ml",
        "labels": {QUEUE_LABEL: "team-a", "shaper.io/team": "vision"},
        "annotations": {"example.com/owner": "ada"},
    }
    assert "status" not in cleaned
    spec = cleaned["spec"]
    assert set(spec) == {"parallelism", "completions", "template"}
    template = spec["template"]
    assert template["metadata"] == {
        "labels": {"app": "t"},
        "annotations": {"shaper.io/checkpointable": "true"},
    }
    pod = template["spec"]
    assert pod["nodeSelector"] == {"disk": "ssd"} and "nodeName" not in pod
    # Shaper's hostname pin goes; the user's other requirements stay.
    assert pod["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                ]
            }
        },
        "podAntiAffinity": {"x": 1},
    }
    assert served_job()["spec"]["suspend"] is True  # the served object is not changed


def test_a_manual_selector_stays_and_a_lone_pin_leaves_no_affinity() -> None:
    job = served_job()
    job["spec"]["manualSelector"] = True
    job["spec"]["template"]["spec"]["affinity"] = pinned_affinity(None, ["n1", "n2"])
    cleaned = clean_job(job)
    assert cleaned["spec"]["selector"] == job["spec"]["selector"]
    assert "affinity" not in cleaned["spec"]["template"]["spec"]
    assert unpinned({"affinity": pinned_affinity(None, ["n1"])}) == {}


def test_move_names_become_distinct_dns_labels() -> None:
    long = "shaper-123456-" + "a-very-long-namespace/job/" + "x" * 100
    names = {
        moved_job_name(move)
        for move in (
            "shaper-7-ml/job/train",
            "shaper-7-ml/job/Train",
            long,
            "shaper-8-ml/job/train",
        )
    }
    assert len(names) == 4
    assert all(DNS_LABEL.match(n) and len(n) <= 63 for n in names), names
    assert moved_job_name("shaper-7-ml/job/train") == moved_job_name("shaper-7-ml/job/train")
    assert moved_job_name("shaper-7-ml/job/train").startswith("shaper-7-ml-job-train-")
    assert DNS_LABEL.match(moved_job_name("@@@"))


def test_a_spec_becomes_the_marked_job_held_and_pinned_as_asked() -> None:
    spec = job_submit_spec(served_job(), SchedulerKind.kubernetes)
    assert spec is not None
    move = "shaper-9-ml/job/train"
    job = job_from_spec(
        spec,
        move=move,
        scheduler=SchedulerKind.kubernetes,
        cluster="b",
        nodes=["bnode-2"],
        suspend=True,
        portable_namespace="default",
    )
    assert job["metadata"]["name"] == moved_job_name(move)
    assert job["metadata"]["namespace"] == "ml"
    assert job["metadata"]["labels"][MOVE_MARK] == moved_job_name(move)
    assert job["metadata"]["annotations"][MOVE_MARK] == move
    assert job["spec"]["suspend"] is True
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["z1"]},
                {"key": HOSTNAME_LABEL, "operator": "In", "values": ["bnode-2"]},
            ]
        }
    ]
    # The pin is for its first run here: stamped with the Job's own affinity (its zone).
    # (The source cluster's stamp is not carried over.)
    zone = {"key": "zone", "operator": "In", "values": ["z1"]}
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}]
            }
        },
        "podAntiAffinity": {"x": 1},
    }
    assert read_pin(job["metadata"]["annotations"]) == Pin(0, ("bnode-2",), own)


def test_a_spec_another_scheduler_wrote_is_refused_without_a_portable_form() -> None:
    spec = job_submit_spec(served_job(), SchedulerKind.kueue)
    assert spec is not None
    with pytest.raises(ConnectorError, match="a kueue job cannot run on kubernetes") as refused:
        job_from_spec(
            spec,
            move="m",
            scheduler=SchedulerKind.kubernetes,
            cluster="b",
            nodes=None,
            suspend=False,
            portable_namespace="default",
        )
    assert not refused.value.retryable
    bad = SubmitSpec(
        scheduler=SchedulerKind.kubernetes, native={"job": {"apiVersion": "v1", "kind": "Pod"}}
    )
    with pytest.raises(ConnectorError, match="not a batch/v1 Job"):
        job_from_spec(
            bad,
            move="m",
            scheduler=SchedulerKind.kubernetes,
            cluster="b",
            nodes=None,
            suspend=False,
            portable_namespace="default",
        )


def test_a_job_above_the_wire_bound_carries_no_spec(caplog: pytest.LogCaptureFixture) -> None:
    job = served_job()
    job["metadata"]["annotations"]["example.com/blob"] = "x" * MAX_SUBMIT_SPEC
    assert job_submit_spec(job, SchedulerKind.kubernetes) is None
    assert "cannot move to another cluster" in caplog.text
