"""A job's own speeds on GPU models as every connector reads them (wire.speeds): one key,
``shaper.io/speeds``, in a Slurm job's comment, a Kubernetes Job's annotations (and so a
Kueue Workload's owner), an Armada job's annotations and a Ray submission's metadata.
Pure translations over the objects the residency tests use; no scheduler runs here (the
real Slurm and Kubernetes read it in tests/connectors/test_slurm_cluster.py and
tests/k8s/test_kubernetes_telemetry.py). An entry a connector cannot read is left out,
logged once."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from connectors.armada.reports import job_report as armada_report
from connectors.kubernetes.pods import JobGroup, OwnerRef
from connectors.kubernetes.pods import job_report as kubernetes_report
from connectors.kueue.workloads import workload_report
from connectors.ray.config import RayConnectorConfig
from connectors.ray.translate import job_report as ray_report
from connectors.slurm.config import SlurmMapping
from connectors.slurm.parse import parse_job
from tests.connectors.test_kubernetes_translate import CONTEXT, QUEUES, WAITING, job
from tests.connectors.test_residency import ARMADA, armada_queued, ray_pending
from wire import speeds as speeds_module
from wire.speeds import read_speeds

RECORDED = Path(__file__).parent / "data" / "slurm-22.05-recorded"


@pytest.fixture(autouse=True)
def _nothing_warned_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no (job, entry) logged (wire.speeds logs each once)."""
    monkeypatch.setattr(speeds_module, "_WARNED", set())


SPEEDS = {"H100": 2.5, "A100-80G": 1.0}


@pytest.mark.parametrize(
    ("text", "speeds"),
    [
        (None, {}),
        ("", {}),
        ("H100=2.5,A100-80G=1", SPEEDS),
        (" H100 = 2.5 , A100-80G=1 ,", SPEEDS),
        ("H100=2,H100=2.5,A100-80G=1", SPEEDS),  # the later one wins
        ("H100=0.01", {"H100": 0.01}),
        ("H100=100", {"H100": 100.0}),
    ],
)
def test_the_text_form(text: str | None, speeds: dict[str, float]) -> None:
    assert read_speeds(text, job="j") == speeds


@pytest.mark.parametrize(
    "entry",
    [
        "H100",
        "H100=",
        "=2",
        "H100=0",
        "H100=1e-309",
        "H100=0.009",
        "H100=100.5",
        "H100=nan",
        "H100=inf",
    ],
)
def test_an_entry_it_cannot_read_is_left_out_and_logged(
    entry: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="wire.speeds"):
        assert read_speeds(f"{entry},A100-80G=1", job="j") == {"A100-80G": 1.0}
    assert [r.getMessage() for r in caplog.records] == [
        f"job j: ignoring {entry!r} in shaper.io/speeds (MODEL=SPEED, a speed in [0.01, 100])"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wire.speeds"):
        assert read_speeds(f"{entry},A100-80G=1", job="j") == {"A100-80G": 1.0}
    assert caplog.records == []  # the next read of the same job says nothing more


def test_at_most_64_models_are_kept(caplog: pytest.LogCaptureFixture) -> None:
    text = ",".join(f"m{i}=1" for i in range(70))
    with caplog.at_level(logging.WARNING, logger="wire.speeds"):
        speeds = read_speeds(text, job="j")
    assert list(speeds) == [f"m{i}" for i in range(64)]
    assert [r.getMessage() for r in caplog.records] == [
        "job j: shaper.io/speeds names more than 64 models"
    ]


# --- Slurm: a word of the comment, where the mapping honours job tags ------------------


def test_slurm_reads_the_comment_with_its_gres_aliases() -> None:
    recorded = json.loads((RECORDED / "rest-jobs-v0.0.38.json").read_text())["jobs"][0]
    comment = "shaper:priority=42 shaper.io/speeds=h100=2.5,A100-80G=1 shaper.io/allowed-clusters=a"
    mapping = SlurmMapping(gpu_model_aliases={"h100": "H100"})
    tagged = parse_job({**recorded, "comment": comment}, mapping).report
    assert tagged.speeds == SPEEDS and tagged.priority == 42
    assert tagged.residency is not None and tagged.residency.allowed_clusters == ["a"]
    assert parse_job(recorded, mapping).report.speeds == {}
    unheard = SlurmMapping(gpu_model_aliases={"h100": "H100"}, honor_job_tags=False)
    assert parse_job({**recorded, "comment": comment}, unheard).report.speeds == {}


# --- Kubernetes and Kueue: the Job's (or its template's, or its pods') annotations ------


def _annotated(**annotations: str) -> dict[str, object]:
    obj = job("j-b", suspend=True)
    obj["metadata"]["annotations"] = annotations  # type: ignore[index]
    return obj


def test_kubernetes_and_kueue_read_the_annotation_with_the_product_aliases() -> None:
    group = JobGroup(
        OwnerRef("Job", "ml", "j-b"),
        _annotated(**{"shaper.io/speeds": "fast-one=2.5,A100-80G=1"}),
    )
    context = replace(CONTEXT, gpu_model_aliases={"fast-one": "H100"})
    report = kubernetes_report(group, context)
    assert report is not None and report.speeds == SPEEDS
    # A GPU product label is read as the nodes' is; a catalogue name as written.
    labelled = JobGroup(
        OwnerRef("Job", "ml", "j-b"),
        _annotated(**{"shaper.io/speeds": "NVIDIA-H100-80GB-HBM3=2.5,A100-80G=1"}),
    )
    assert kubernetes_report(labelled, CONTEXT).speeds == SPEEDS  # type: ignore[union-attr]
    queued = workload_report(WAITING, group, context, QUEUES)
    assert queued is not None and queued.speeds == SPEEDS
    bare = JobGroup(OwnerRef("Job", "ml", "j-b"), _annotated())
    assert kubernetes_report(bare, context).speeds == {}  # type: ignore[union-attr]


def test_a_kubernetes_service_has_no_speeds() -> None:
    """Speeds are for block jobs (the wire refuses them on a service): a Deployment's
    annotation is not read."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat",
            "namespace": "ml",
            "annotations": {"shaper.io/speeds": "H100=2.5"},
        },
        "spec": {"replicas": 1, "template": job("x")["spec"]["template"]},  # type: ignore[index]
    }
    report = kubernetes_report(JobGroup(OwnerRef("Deployment", "ml", "chat"), deployment), CONTEXT)
    assert report is not None and report.shape == "elastic" and report.speeds == {}


# --- Armada: the job's annotations ---------------------------------------------------------


def test_armada_reads_the_annotations() -> None:
    queued = armada_queued({"shaper.io/speeds": "H100=2.5,A100-80G=1"})
    assert armada_report(queued, ARMADA).speeds == SPEEDS


# --- Ray: the submission's metadata ------------------------------------------------------


def test_ray_reads_the_submission_metadata() -> None:
    submission = ray_pending({"shaper.io/speeds": "A100=1,T4=0.3"})
    report = ray_report(submission, None, RayConnectorConfig(cluster="ray"), node_gpus={})
    assert report.speeds == {"A100": 1.0, "T4": 0.3}
