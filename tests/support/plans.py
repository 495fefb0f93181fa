"""Waiting on approved actions, for the end-to-end tests against real schedulers (Slurm in
tests/connectors, Kubernetes and Kueue in tests/k8s)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine

from agent import procs
from tests.actions.conftest import action_state
from tests.actions.helpers import TERMINAL


def wait_until_settled(
    engine: Engine, action_ids: list[int], *, timeout_s: float, context: Callable[[], str]
) -> dict[int, str]:
    """Until every action has reached a terminal state; returns their states. One still
    open after ``timeout_s`` fails the test, naming each action's state and steps, then
    what ``context()`` tells of the scheduler (its queue, the connector's log)."""

    def settled() -> bool:
        return all(action_state(engine, a)[0] in TERMINAL for a in action_ids)

    if not procs.wait_until(settled, timeout=timeout_s, interval=0.5):
        raise AssertionError(
            "actions stuck: "
            + "; ".join(
                f"{a} {state} {[(s.name, s.state, s.error) for s in steps]}"
                for a in action_ids
                for state, steps in [action_state(engine, a)]
            )
            + f"\n{context()}"
        )
    return {a: action_state(engine, a)[0] for a in action_ids}
