"""Connector fencing: one live connector session per cluster, and replays told apart.

A cluster's live session is ``clusters.connector_session`` (since
``connector_session_since``). Without fencing, two connectors on one cluster — an old pod
that has not died yet and its replacement — would each overwrite the other's view on every
push, and jobs one had seen finish would run again.

``admit`` decides, with the cluster row locked by the caller, before anything is read:

1. A session listed in ``superseded_sessions`` is refused whatever it sends:
   ``StaleSession`` (409 ``stale_session``). Another connector owns the cluster.
2. The live session with ``seq`` ≤ ``last_seq`` is a replay or out of order. Its
   ``[seq, digest]`` is looked up in ``recent_pushes`` (the live session's last
   ``REPLAY_WINDOW`` accepted pushes): the same digest is a duplicate (acknowledged,
   nothing written); another digest is ``ReplayMismatch`` (409 ``replay_mismatch``); no
   entry is ``OutOfOrder`` (409 ``out_of_order``) — never accepted, or older than the
   window and so not distinguishable from one that never was: not acknowledged either way.
3. A delta must follow the live session's last accepted push (``seq`` = ``last_seq`` + 1),
   else ``SnapshotRequired`` (409 ``snapshot_required``), as before fencing.
4. A snapshot from a session never seen takes the cluster over (``Admission.takes_over``).

``record`` then (after the push is written, in the same transaction) stores the seq and
digest, adds the seqs the live session skipped to ``seq_gaps``, and on a take-over moves
the previous session to ``superseded_sessions`` (the last ``SUPERSEDED_KEPT``; one older
than that would count as new again) and starts an empty digest window for the new one.

The digest is SHA-256 of the push as the wire schema serializes it: two bodies that
parse to the same push (key order, spacing, defaults written out or not) are the same
content.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from app.clusters.models import Cluster
from app.core.errors import Conflict, SnapshotRequired
from wire.telemetry import REPLAY_WINDOW, TelemetryDelta, TelemetrySnapshot

SUPERSEDED_KEPT = 64


class StaleSession(Conflict):
    code = "stale_session"


class ReplayMismatch(Conflict):
    code = "replay_mismatch"


class OutOfOrder(Conflict):
    code = "out_of_order"


@dataclass(frozen=True)
class Admission:
    duplicate: bool = False
    takes_over: bool = False


def digest(push: TelemetrySnapshot | TelemetryDelta) -> str:
    return hashlib.sha256(type(push).__pydantic_serializer__.to_json(push)).hexdigest()


def admit(
    cluster: Cluster, push: TelemetrySnapshot | TelemetryDelta, content_digest: str
) -> Admission:
    """Whether ``push`` may be written; raises the 409s above when it may not."""
    session = push.connector_session
    superseded = next((s for s in cluster.superseded_sessions if s.get("session") == session), None)
    if superseded is not None:
        raise StaleSession(
            f"connector session {session!r} was superseded at {superseded['superseded_at']} "
            "by a newer connector session of this cluster: stop this connector",
            field="connector_session",
            resource="cluster",
            resource_id=cluster.name,
            details={"live_since": _iso(cluster.connector_session_since)},
        )
    live = session == cluster.connector_session and cluster.last_seq is not None
    if live and push.seq <= cluster.last_seq:  # type: ignore[operator]
        _check_replay(cluster, push.seq, content_digest)
        return Admission(duplicate=True)
    if isinstance(push, TelemetryDelta):
        if not live:
            raise SnapshotRequired(
                "no snapshot accepted from this connector session yet: send a snapshot",
                field="connector_session",
                resource="cluster",
                resource_id=cluster.name,
            )
        expected = cluster.last_seq + 1  # type: ignore[operator]
        if push.seq != expected:
            raise SnapshotRequired(
                f"sequence gap: expected seq {expected}, got {push.seq}; send a snapshot",
                field="seq",
                resource="cluster",
                resource_id=cluster.name,
                details={"expected_seq": expected},
            )
    return Admission(takes_over=not live)


def _check_replay(cluster: Cluster, seq: int, content_digest: str) -> None:
    accepted = next((d for s, d in cluster.recent_pushes if s == seq), None)
    if accepted == content_digest:
        return
    if accepted is not None:
        raise ReplayMismatch(
            f"seq {seq} of this connector session was accepted with other content; "
            "a seq is never reused: send a snapshot with a higher seq",
            field="seq",
            resource="cluster",
            resource_id=cluster.name,
        )
    raise OutOfOrder(
        f"seq {seq} is below the last accepted seq {cluster.last_seq} of this connector "
        "session and is not one of its recent pushes: send a snapshot with a higher seq",
        field="seq",
        resource="cluster",
        resource_id=cluster.name,
        details={"last_seq": cluster.last_seq},
    )


def record(
    cluster: Cluster,
    push: TelemetrySnapshot | TelemetryDelta,
    content_digest: str,
    *,
    admission: Admission,
    now: datetime,
) -> None:
    """Note an accepted push on the (locked) cluster row; the caller commits."""
    # New lists, not in-place changes: the JSON columns are saved when reassigned.
    pushes: list[list[int | str]] = list(cluster.recent_pushes)
    if admission.takes_over:
        if cluster.connector_session is not None:
            loser: dict[str, str | int | None] = {
                "session": cluster.connector_session,
                "since": _iso(cluster.connector_session_since),
                "superseded_at": now.isoformat(),
                "last_seq": cluster.last_seq,
            }
            cluster.superseded_sessions = [*cluster.superseded_sessions, loser][-SUPERSEDED_KEPT:]
        cluster.connector_session = push.connector_session
        cluster.connector_session_since = now
        pushes = []
    elif cluster.last_seq is not None and push.seq > cluster.last_seq + 1:
        # The same session skipped seqs (a delta refused for a gap, then this snapshot):
        # pushes it built that never landed, for shaper_telemetry_seq_gaps_total.
        cluster.seq_gaps = (cluster.seq_gaps or 0) + push.seq - cluster.last_seq - 1
    entry: list[int | str] = [push.seq, content_digest]
    cluster.recent_pushes = [*pushes, entry][-REPLAY_WINDOW:]
    cluster.last_seq = push.seq


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None
