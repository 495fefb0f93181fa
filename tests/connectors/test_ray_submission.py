"""connectors.ray.submission on its own: which jobs cannot move, the wire's bound on a
spec, move names as submission ids, and specs the target refuses or turns into a
submission. The real cluster's side of it is tests/connectors/test_ray_moves.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connectors.base import ConnectorError
from connectors.ray.config import RayConnectorConfig
from connectors.ray.submission import (
    MOVE_KEY,
    NODE_ID_LABEL,
    move_submission_id,
    not_movable,
    ran,
    submission_body,
    submit_spec,
)
from wire.telemetry import MAX_SUBMIT_SPEC, PortableSpec, SchedulerKind, SubmitSpec

CONFIG = RayConnectorConfig(cluster="ray-b")


def test_a_job_with_a_package_in_its_clusters_gcs_cannot_move() -> None:
    uploaded = {
        "entrypoint": "python train.py",
        "runtime_env": {"working_dir": "gcs://_ray_pkg_1.zip"},
    }
    modules = {
        "entrypoint": "x",
        "runtime_env": {"py_modules": ["s3://b/m.zip", "gcs://_ray_pkg_2.zip"]},
    }
    assert "gcs://_ray_pkg_1.zip" in (not_movable(uploaded) or "")
    assert "gcs://_ray_pkg_2.zip" in (not_movable(modules) or "")
    assert not_movable({"entrypoint": "x", "runtime_env": {"working_dir": "s3://b/w.zip"}}) is None
    assert "entrypoint" in (not_movable({"runtime_env": {}}) or "")


def test_a_spec_above_the_wires_bound_is_not_made() -> None:
    huge = {"entrypoint": "sleep 1", "runtime_env": {"env_vars": {"X": "x" * MAX_SUBMIT_SPEC}}}
    with pytest.raises(ValidationError, match="above"):
        submit_spec(huge, CONFIG)


def test_the_spec_leaves_out_what_names_the_source_cluster() -> None:
    spec = submit_spec(
        {
            "submission_id": "old.r2",
            "job_id": "02000000",
            "driver_node_id": "abc",
            "status": "RUNNING",
            "entrypoint": "python train.py",
            "runtime_env": {"env_vars": {"SHAPER_RESUME_FROM": "/ckpt", "SHAPER_NODES": "w1"}},
            "metadata": {"shaper.io/job": "old", "shaper.io/attempt": "2", "team": "vision"},
            "entrypoint_num_gpus": 1,
            "entrypoint_memory": None,
            "entrypoint_label_selector": {"shaper.io/node": "w1", "zone": "eu"},
        },
        CONFIG,
    )
    assert spec.native == {
        "entrypoint": "python train.py",
        "runtime_env": {},
        "metadata": {"team": "vision"},
        "entrypoint_num_gpus": 1,
        "entrypoint_label_selector": {"zone": "eu"},
    }


def test_move_names_become_submission_ids_one_to_one() -> None:
    assert move_submission_id("shaper-7-job.1") == "shaper-7-job.1"
    slash, colon = move_submission_id("shaper-7-a/b"), move_submission_id("shaper-7-a:b")
    assert slash != colon and "/" not in slash and ":" not in colon
    assert slash == move_submission_id("shaper-7-a/b")


def test_the_target_takes_only_a_jobs_api_submission_and_pins_its_driver() -> None:
    spec = SubmitSpec(
        scheduler=SchedulerKind.ray,
        native={"entrypoint": "sleep 1", "entrypoint_label_selector": {"zone": "eu"}},
    )
    body = submission_body(spec, name="m", submission_id="m", config=CONFIG, nodes={"w2": "f00d"})
    assert body["submission_id"] == "m"
    assert body["metadata"] == {MOVE_KEY: "m"}
    assert body["entrypoint_label_selector"] == {"zone": "eu", NODE_ID_LABEL: "in(f00d)"}
    assert body["runtime_env"] == {"env_vars": {"SHAPER_NODES": "w2"}}
    smuggled = SubmitSpec(
        scheduler=SchedulerKind.ray, native={"entrypoint": "x", "submission_id": "theirs"}
    )
    with pytest.raises(ConnectorError, match="not a Ray job") as refused:
        submission_body(smuggled, name="m", submission_id="m", config=CONFIG)
    assert not refused.value.retryable


def test_another_schedulers_spec_runs_through_its_portable_form_only() -> None:
    slurm = SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "#!/bin/sh\n"})
    with pytest.raises(ConnectorError, match="no portable form") as refused:
        submission_body(slurm, name="m", submission_id="m", config=CONFIG)
    assert not refused.value.retryable
    portable = slurm.model_copy(
        update={
            "portable": PortableSpec(command=["train", "--lr", "0.1 x"], gpus=2, env={"A": "1"})
        }
    )
    body = submission_body(portable, name="m", submission_id="m", config=CONFIG)
    assert body["entrypoint"] == "train --lr '0.1 x'"
    assert body["entrypoint_num_gpus"] == 2
    assert body["runtime_env"] == {"env_vars": {"A": "1"}}
    assert body["metadata"]["shaper.io/gpus"] == "2"
    fake_gpus = RayConnectorConfig(cluster="ray-b", gpu_resource="fake_gpu")
    body = submission_body(portable, name="m", submission_id="m", config=fake_gpus)
    assert body["entrypoint_resources"] == {"fake_gpu": 2} and "entrypoint_num_gpus" not in body
    image = slurm.model_copy(update={"portable": PortableSpec(image="r/i:1", command=["x"])})
    with pytest.raises(ConnectorError, match="container image"):
        submission_body(image, name="m", submission_id="m", config=CONFIG)


def test_a_job_ran_only_when_its_entrypoint_did() -> None:
    assert ran({"status": "SUCCEEDED"})
    assert ran({"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR"})
    assert not ran({"status": "FAILED", "error_type": "JOB_SUPERVISOR_ACTOR_START_TIMEOUT"})
    assert not ran({"status": "FAILED", "error_type": "RUNTIME_ENV_SETUP_FAILURE"})
    assert not ran({"status": "STOPPED"}) and not ran({"status": "RUNNING"})
