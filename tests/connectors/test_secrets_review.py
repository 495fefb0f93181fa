"""Secrets a connector holds, kept out of ``repr()`` of its settings and configuration, and
a workload's environment out of what it logs and answers about a malformed step."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.actions import ConnectorStepExecutor
from connectors.runner import RunnerConfig
from connectors.settings import ConnectorSettings

TOKEN = "shp_0123456789ab_" + "S" * 43


def test_connector_settings_repr_hides_the_broker_password_and_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHAPER_BROKER_URL", "amqp://shaper:broker-password@rabbit:5672//")
    monkeypatch.setenv("SHAPER_CONNECTOR_TOKEN", TOKEN)

    settings = ConnectorSettings()

    shown = repr(settings) + str(settings)
    assert "broker-password" not in shown
    assert TOKEN not in shown
    assert settings.broker_url == "amqp://shaper:broker-password@rabbit:5672//"


def test_runner_config_repr_hides_the_token() -> None:
    config = RunnerConfig(control_plane="http://127.0.0.1:8000", cluster="lab", token=TOKEN)

    assert TOKEN not in repr(config) + str(config)
    assert config.token.get_secret_value() == TOKEN


def test_a_malformed_step_message_is_answered_and_logged_without_its_arguments(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A step's arguments may carry a checkpoint image with the workload's environment;
    pydantic's error text quotes the input it refused, so neither the report (published to
    viewers) nor the log may be that text."""
    executor = ConnectorStepExecutor(object(), cluster="lab", state_dir=tmp_path)
    image = {"workload": {"env": {"HF_TOKEN": "hf_job-secret"}}}
    # Arguments that are not a mapping: refused, and the refusal names the field only.
    answerable = {"action_id": 7, "key": "k", "step": "requeue", "args": [image]}
    report = executor.handle(answerable)
    assert report is not None and not report.ok
    assert "args" in (report.error or "") and "hf_job-secret" not in (report.error or "")
    with caplog.at_level(logging.ERROR, logger="connectors.actions"):
        assert executor.handle({"step": "requeue", "args": {"image": image}}) is None
    assert "unanswerable step message" in caplog.text and "hf_job-secret" not in caplog.text


def test_a_connectors_log_lines_are_redacted_as_the_control_planes(tmp_path: Path) -> None:
    """A connector or node agent process logs through ``wire.redaction.log_to_stderr``
    (it does not import the control plane, whose set-up redacted alone): a broker URL's
    password, a token or a slurmrestd JWT in a message or a traceback never reaches the
    stream. Run in a process of its own: ``basicConfig`` acts once per process."""
    script = (
        "import logging\n"
        "from wire.redaction import log_to_stderr\n"
        "log_to_stderr('INFO')\n"
        "log = logging.getLogger('connectors.slurm')\n"
        "log.warning('broker amqp://shaper:broker-password@rabbit:5672// down')\n"
        f"log.info('pushing with {TOKEN}')\n"
        "try:\n"
        "    raise RuntimeError('slurmrestd: eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJzIn0.c2ln refused')\n"
        "except RuntimeError:\n"
        "    log.exception('ping failed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    written = done.stderr
    assert "ping failed" in written and "RuntimeError" in written
    assert "amqp://shaper:***@rabbit" in written and "broker-password" not in written
    assert TOKEN not in written and "shp_0123456789ab_***" in written
    assert "c2ln refused" not in written and "slurmrestd: *** refused" in written
