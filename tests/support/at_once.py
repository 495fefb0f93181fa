"""Transactions started together, each in its own thread and session: what two callers
that lock the same rows in different orders do to each other (a deadlock, on PostgreSQL,
aborts one of them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from sqlalchemy import Engine
from sqlmodel import Session

from app.core.errors import Conflict

Work = Callable[[Session], object]


def at_once(engine: Engine, works: Mapping[str, Work], *, join_s: float = 60.0) -> dict[str, str]:
    """Run each work in its own thread and session, all started together; per name
    "done", "conflict: <message>" (a refusal the API would answer 409), or "error: <type>:
    <message>" for anything else (a deadlock)."""
    outcomes: dict[str, str] = {}

    def run(name: str, work: Work) -> None:
        with Session(engine) as session:
            try:
                work(session)
                outcomes[name] = "done"
            except Conflict as exc:
                outcomes[name] = f"conflict: {exc}"
            except Exception as exc:  # the deadlock, or anything else unexpected
                outcomes[name] = f"error: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=run, args=item) for item in works.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_s)
    return outcomes


def pause(barrier: threading.Barrier, timeout_s: float = 2.0) -> None:
    """Wait for the other side at ``barrier``; go on alone after ``timeout_s`` (the other
    side waits for a lock this one holds, which is the point where it should)."""
    try:
        barrier.wait(timeout=timeout_s)
    except threading.BrokenBarrierError:
        pass
