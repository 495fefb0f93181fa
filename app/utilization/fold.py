"""Fold ``utilization_rollup_deltas`` (what PostgreSQL's triggers append at every write)
into the periods of ``utilization_rollups``.

Reads sum the periods and the deltas not folded yet in one statement
(``app.utilization.rollup``), so folding changes no answer: it keeps the deltas few, and
so the reads cheap. Each batch is one statement in its own transaction: it deletes the
oldest deltas and adds them into every period of their groups; a reader's snapshot sees
them either before or after, never twice. One folder at a time (an advisory lock, never
waited for): two would lock the same roll-up rows, each in its own order.

A delta that names a node is filed under the node's GPU model at the fold. A node's
model change moves what was folded of it, and holds the folder's lock shared until it
commits, so no fold files the node's deltas under the old model meanwhile.

Only the folder writes the roll-up, so writers never wait on it. It skips the deltas of
a cluster whose row is locked ``FOR UPDATE`` (its deletion, a job set's move): adding to
the roll-up checks its foreign key, which would wait for that holder while this
transaction holds the deltas the holder may delete (a deletion's cascade). A connector's
ingest locks the row FOR NO KEY UPDATE, which the check passes, so its cluster's deltas
are folded meanwhile. A skipped delta stays, and stays exact, until the next fold.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from app.utilization.rollup import ALL_TIME_US, EXACT_US, LEVELS_US, NODE_MODEL

ROLLUP_FOLD_LOCK_KEY = 0x524F_4C4C  # "ROLL"
BATCH = 20_000
# One run folds at most this many batches (the task's time limit covers them); a larger
# backlog, after the folder was down, is folded over the next runs.
MAX_BATCHES = 50

_SUMS = ("gpus", "gpu_us", "opened", "closed", "samples", "sample_sum")
_GROUP = "dimension, cluster_id, gpu_model_id, team"
_LEVELS = (ALL_TIME_US, EXACT_US, *LEVELS_US)


def _fold_statement() -> sa.TextClause:
    levels = " UNION ALL ".join(f"SELECT CAST({level} AS bigint) AS period_us" for level in _LEVELS)
    period_start = "CASE WHEN l.period_us = 0 THEN 0 ELSE e.at_us / l.period_us * l.period_us END"
    moment = "CASE WHEN l.period_us = 0 THEN 0 ELSE e.gpus * (e.at_us % l.period_us) END"
    values = ["e.gpus", moment, "e.opened", "e.closed", "e.samples", "e.sample_sum"]
    sums = [f"SUM({v})" for v in values]
    updates = ", ".join(f"{c} = utilization_rollups.{c} + excluded.{c}" for c in _SUMS)
    return sa.text(
        # The oldest deltas of clusters whose row is free, their cluster rows held
        # FOR KEY SHARE: the roll-up's foreign key check then finds them held already.
        "WITH picked AS (SELECT d.id FROM utilization_rollup_deltas d"
        " JOIN clusters c ON c.id = d.cluster_id"
        " ORDER BY d.id LIMIT :batch FOR KEY SHARE OF c SKIP LOCKED),"
        " moved AS (DELETE FROM utilization_rollup_deltas"
        " WHERE id IN (SELECT id FROM picked)"
        f" RETURNING {_GROUP}, node_id, at_us, gpus, opened, closed, samples, sample_sum),"
        f" folded AS (INSERT INTO utilization_rollups ({_GROUP}, period_us, period_start_us,"
        f" {', '.join(_SUMS)})"
        f" SELECT e.dimension, e.cluster_id, {NODE_MODEL.format(row='e')}, e.team,"
        f" l.period_us, {period_start}, {', '.join(sums)}"
        f" FROM moved AS e LEFT JOIN nodes n ON n.id = e.node_id CROSS JOIN ({levels}) AS l"
        # Every sum, sample_sum too: a node's model change moves its samples (counts -n on
        # the old model) and another node's new samples there may cancel the count alone.
        " GROUP BY 1, 2, 3, 4, 5, 6 HAVING " + " OR ".join(f"{s} <> 0" for s in sums) +
        " ON CONFLICT (dimension, cluster_id, gpu_model_id, team, period_us, period_start_us)"
        f" DO UPDATE SET {updates})"
        " SELECT count(*) FROM moved"
    )  # fmt: skip


_FOLD = _fold_statement()
# Deltas of a deleted cluster (no foreign key takes them with it): never read, dropped.
_DROP_ORPHANS = sa.text(
    "DELETE FROM utilization_rollup_deltas d"
    " WHERE NOT EXISTS (SELECT 1 FROM clusters c WHERE c.id = d.cluster_id)"
)


def fold_deltas(*, session: Session, batch: int = BATCH, max_batches: int = MAX_BATCHES) -> int:
    """Fold the deltas in batches, each committed; returns how many were folded. 0 on
    SQLite (whose triggers write the roll-up itself) and while another folder runs."""
    if session.get_bind().dialect.name != "postgresql":
        return 0
    folded = 0
    for _ in range(max_batches):
        if not session.execute(
            sa.select(sa.func.pg_try_advisory_xact_lock(ROLLUP_FOLD_LOCK_KEY))
        ).scalar_one():
            session.rollback()
            break
        moved = int(session.execute(_FOLD, {"batch": batch}).scalar_one())
        session.commit()
        folded += moved
        if moved < batch:
            break
    session.execute(_DROP_ORPHANS)
    session.commit()
    return folded
