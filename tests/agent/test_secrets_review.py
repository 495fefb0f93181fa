"""Secrets a node agent holds, kept out of what others see: its token out of the reply
messages' shown arguments, the broker's password out of ``repr()`` of its settings."""

from __future__ import annotations

from typing import Any

import pytest

from agent.settings import AgentSettings
from wire.executor import make_executor_app
from wire.queues import step_task
from wire.steps import StepReport

TOKEN = "shp_0123456789ab_" + "S" * 43
QUEUE = "agent.lab.n1"
REPLIES = "secrets-review-replies"  # a queue of this test's own on the in-memory broker


def _checkpointed(step: dict[str, Any]) -> StepReport:
    """A checkpoint's answer: its result holds the workload's environment."""
    return StepReport(
        action_id=7,
        key=str(step["key"]),
        ok=True,
        result={"image": {"workload": {"env": {"HF_TOKEN": "hf_job-secret"}}}},
        executor=QUEUE,
    )


def _reply_sent_for(step: dict[str, Any]) -> Any:
    """The message the executor sends to the control plane for ``step``, as the broker
    holds it."""
    app = make_executor_app(
        broker="memory://",
        queue=QUEUE,
        steps=["checkpoint"],
        handle=_checkpointed,
        token=TOKEN,
        redirect_stdouts=False,
    )
    app.tasks[step_task(QUEUE, "checkpoint")].run(step)
    with app.connection_for_read() as connection:
        replies = connection.SimpleQueue(REPLIES)
        try:
            message = replies.get(timeout=5)
            message.ack()
            return message
        finally:
            replies.close()


def test_a_reply_shows_neither_the_token_nor_the_result_in_its_arguments() -> None:
    """Celery shows a task's ``kwargsrepr`` (task events, ``celery inspect``, Flower, the
    ``data`` of its log records); by default it is the repr of every argument."""
    message = _reply_sent_for({"key": "a:forward:checkpoint", "reply_queue": REPLIES})

    shown = message.headers["kwargsrepr"]

    assert TOKEN not in shown and TOKEN.rsplit("_", 1)[1] not in shown
    assert "hf_job-secret" not in shown
    assert "a:forward:checkpoint" in shown  # which answer it is, still
    _args, kwargs, _embed = message.payload
    assert kwargs["token"] == TOKEN  # the control plane authenticates the answer with it
    assert kwargs["report"]["result"]["image"]["workload"]["env"] == {"HF_TOKEN": "hf_job-secret"}


def test_agent_settings_repr_hides_the_broker_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPER_BROKER_URL", "redis://:broker-password@redis:6379/0")
    monkeypatch.setenv("SHAPER_AGENT_TOKEN", TOKEN)
    monkeypatch.setenv("SHAPER_AGENT_API_TOKEN", "agent-api-secret")

    settings = AgentSettings()

    shown = repr(settings) + str(settings)
    assert "broker-password" not in shown
    assert TOKEN not in shown and "agent-api-secret" not in shown
    assert settings.broker_url == "redis://:broker-password@redis:6379/0"
