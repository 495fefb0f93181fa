"""A job's residency as every connector reads it (issue 16, wire.residency): the same two
keys, ``shaper.io/cluster-selector`` and ``shaper.io/allowed-clusters``, in a Slurm job's
comment, a Kubernetes Job's annotations (and so a Kueue Workload's owner), an Armada job's
annotations and a Ray submission's metadata. Pure translations over the recorded or
hand-made objects the connectors' other tests use; no scheduler runs here. A value a
connector cannot read keeps the job in its own cluster."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from connectors.armada.config import ArmadaConnectorConfig
from connectors.armada.jobs import ArmadaJob, JobSpec
from connectors.armada.reports import job_report as armada_report
from connectors.kubernetes.pods import JobGroup, OwnerRef
from connectors.kubernetes.pods import job_report as kubernetes_report
from connectors.kueue.workloads import workload_report
from connectors.ray.config import RayConnectorConfig
from connectors.ray.translate import Submission
from connectors.ray.translate import job_report as ray_report
from connectors.slurm.config import SlurmMapping
from connectors.slurm.parse import comment_residency, parse_job
from tests.connectors.test_kubernetes_translate import CONTEXT, QUEUES, WAITING, job
from wire.residency import Residency, parse_residency, read_residency
from wire.telemetry import JobReport

EU = Residency(cluster_selector={"region": "eu", "site": "ams1"}, allowed_clusters=None)
BOTH = Residency(cluster_selector={"region": "eu"}, allowed_clusters=["alpha", "beta"])
KEPT = Residency(allowed_clusters=[])  # unreadable: only the cluster it is in
RECORDED = Path(__file__).parent / "data" / "slurm-22.05-recorded"


@pytest.mark.parametrize(
    ("selector", "clusters", "residency"),
    [
        (None, None, None),
        ("", "  ", None),
        ("region=eu,site=ams1", None, EU),
        (" region = eu , site=ams1 ,", "", EU),
        ("region=eu", "alpha, beta", BOTH),
        (None, "alpha", Residency(allowed_clusters=["alpha"])),
        ("zone=", None, Residency(cluster_selector={"zone": ""})),
    ],
)
def test_the_text_form(selector: str | None, clusters: str | None, residency: Residency) -> None:
    assert parse_residency(selector, clusters) == residency


@pytest.mark.parametrize(
    ("selector", "clusters", "message"),
    [
        ("region", None, "'region' is not a new key=value"),
        ("region=eu,region=us", None, "'region=us' is not a new key=value"),
        ("region=eu west", None, "value 'eu west'"),
        (None, "Alpha", "pattern"),
    ],
)
def test_a_malformed_value_says_what_and_a_connector_keeps_the_job_home(
    selector: str | None, clusters: str | None, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_residency(selector, clusters)
    values = {
        key: value
        for key, value in (
            ("shaper.io/cluster-selector", selector),
            ("shaper.io/allowed-clusters", clusters),
        )
        if value is not None
    }
    with caplog.at_level(logging.WARNING, logger="wire.residency"):
        assert read_residency(values, job="j1") == KEPT
    assert "job j1: keeping it in its cluster" in caplog.text


def test_the_wire_refuses_what_a_connector_would_not_send() -> None:
    with pytest.raises(ValidationError) as caught:
        JobReport(external_id="j", residency={"cluster_selector": {"region": "eu west"}})  # type: ignore[arg-type]
    assert caught.value.errors()[0]["loc"] == ("residency", "cluster_selector")
    with pytest.raises(ValidationError):
        JobReport(external_id="j", residency={"clusters": ["a"]})  # type: ignore[arg-type]


# --- Slurm: words of the job's --comment -------------------------------------------------


@pytest.mark.parametrize(
    ("comment", "residency"),
    [
        ("", None),
        ("shaper:kind=training,priority=5", None),
        ("shaper:kind=training shaper.io/cluster-selector=region=eu,site=ams1", EU),
        (
            "shaper.io/allowed-clusters=alpha,beta note shaper.io/cluster-selector=region=eu",
            BOTH,
        ),
        ("shaper.io/cluster-selector=region", KEPT),
        ("shaper.io/cluster-selectors=region=eu", None),  # another key: not a residency
    ],
)
def test_slurm_reads_the_comment(comment: str, residency: Residency | None) -> None:
    assert comment_residency(comment, job="1") == residency


def test_slurm_carries_it_on_a_recorded_job_and_the_tags_still_apply() -> None:
    document = json.loads((RECORDED / "rest-jobs-v0.0.38.json").read_text())
    recorded = document["jobs"][0]
    plain = parse_job(recorded, SlurmMapping()).report
    assert plain.residency is None
    comment = "shaper:priority=42 shaper.io/cluster-selector=region=eu,site=ams1"
    tagged = parse_job({**recorded, "comment": comment}, SlurmMapping()).report
    assert tagged.residency == EU and tagged.priority == 42


# --- Kubernetes and Kueue: the Job's (or its template's, or its pods') annotations ------


def _annotated(**annotations: str) -> dict[str, object]:
    obj = job("j-b", suspend=True)
    obj["metadata"]["annotations"] = annotations  # type: ignore[index]
    return obj


def test_kubernetes_and_kueue_read_the_annotations() -> None:
    annotations = {
        "shaper.io/cluster-selector": "region=eu",
        "shaper.io/allowed-clusters": "alpha,beta",
    }
    group = JobGroup(OwnerRef("Job", "ml", "j-b"), _annotated(**annotations))
    report = kubernetes_report(group, CONTEXT)
    assert report is not None and report.residency == BOTH
    queued = workload_report(WAITING, group, CONTEXT, QUEUES)
    assert queued is not None and queued.residency == BOTH

    bare = JobGroup(OwnerRef("Job", "ml", "j-b"), _annotated())
    assert kubernetes_report(bare, CONTEXT).residency is None  # type: ignore[union-attr]
    bad = JobGroup(OwnerRef("Job", "ml", "j-b"), _annotated(**{"shaper.io/cluster-selector": "eu"}))
    assert kubernetes_report(bad, CONTEXT).residency == KEPT  # type: ignore[union-attr]


# --- Armada: the job's annotations ---------------------------------------------------------


ARMADA = ArmadaConnectorConfig.model_validate(
    {
        "cluster": "armada",
        "url": "127.0.0.1:50051",
        "job_sets": [{"queue": "research", "job_set": "train"}],
    }
)


def armada_queued(annotations: dict[str, str]) -> ArmadaJob:
    """A queued Armada job of one GPU with ``annotations`` (its report: ``ARMADA``)."""
    spec = JobSpec(
        priority=0,
        namespace="default",
        labels={},
        annotations=annotations,
        node_selector={},
        gpus=1,
        encoded=b"",
    )
    return ArmadaJob(job_id="J", queue="research", job_set="train", spec=spec)


def test_armada_reads_the_annotations() -> None:
    queued = armada_queued({"shaper.io/cluster-selector": "region=eu,site=ams1"})
    assert armada_report(queued, ARMADA).residency == EU


# --- Ray: the submission's metadata ------------------------------------------------------


def ray_pending(metadata: dict[str, str]) -> Submission:
    """A pending Ray Jobs API submission with ``metadata``."""
    raw = {
        "submission_id": "raysubmit_1",
        "status": "PENDING",
        "entrypoint": "python train.py",
        "start_time": int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000),
        "metadata": metadata,
    }
    return Submission(external_id="raysubmit_1", submission_id="raysubmit_1", attempt=0, raw=raw)


def test_ray_reads_the_submission_metadata() -> None:
    submission = ray_pending({"shaper.io/allowed-clusters": "alpha"})
    report = ray_report(submission, None, RayConnectorConfig(cluster="ray"), node_gpus={})
    assert report.residency == Residency(allowed_clusters=["alpha"])
