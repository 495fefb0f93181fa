"""utilization roll-up deltas: PostgreSQL's triggers append to utilization_rollup_deltas
instead of upserting the roll-up's shared rows; a periodic job folds them in

The triggers of ``ef0a1b2c3d9a`` upserted, in the writer's transaction, every period row
(all time first) of the writer's groups. Every writer of a cluster (its connector's
ingest, sagas, node agents) then waited on the same rows until the holder committed, and
concurrent writers deadlocked: each statement took its rows in key order, but a
transaction's next statement could want rows held by a writer waiting on its first (a
push that changes a node's GPU model locks ``gpu_model`` rows, then its samples want the
``cluster`` rows an agent holds, who wants those ``gpu_model`` rows); and the roll-up's
foreign key locked the cluster row ``FOR KEY SHARE`` from a saga that held a job row,
behind the ingest's ``FOR UPDATE`` of that cluster, while the ingest wanted the job row
(``tests/app/test_utilization_writers.py``: 79 deadlocks in 270 writes). No lock order
that a trigger can set holds across the statements of a transaction, so writers now take
no lock on shared rows at all.

A trigger appends one row per group and instant (three rows where it upserted twenty-seven
periods), with no unique key and no foreign key: writers never wait on one another's
roll-up work. ``app.utilization.fold`` moves the rows into the periods (one statement per
batch; one folder at a time), and ``app.utilization.rollup`` reads the periods and the rows
not folded yet in one statement, so every answer stays exact.

A ``gpu_model`` row appended for a write names its node (``node_id``): its group is the
node's GPU model when it is folded or read, not when it was written. A node's model
change moves what was folded already (the node's events less its rows still to fold) from
the old model to the new, as rows of its own, after waiting for a fold in flight (a
shared advisory lock that the folder takes exclusively). So a write that commits after
the change, having read the old model, is still filed under the new one; the triggers of
``ef0a1b2c3d9a`` left it under the old model.

SQLite keeps its row triggers, which upsert the roll-up directly: it has one writer at a
time, so nothing waits in a cycle there, and its deltas table stays empty.

The functions keep their names and their triggers: ``CREATE OR REPLACE`` swaps the bodies.
The downgrade folds every delta, then restores ``ef0a1b2c3d9a``'s bodies.

Revision ID: 0a1b2c3d4e5f
Revises: f0a1b2c3d4e5
Create Date: 2026-12-04 12:00:00.000000
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0a1b2c3d4e5f"
down_revision: str | None = "f0a1b2c3d4e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# app.utilization.fold.ROLLUP_FOLD_LOCK_KEY: the folder holds it exclusively.
ROLLUP_FOLD_LOCK_KEY = 0x524F_4C4C
_SUMS = ("gpus", "opened", "closed", "samples", "sample_sum")
_AT_US = "(extract(epoch FROM {at}) * 1000000)::bigint"  # exactly, no float on the way


def _allocation_events(
    source: str,
    sign: int,
    *,
    node: str = "a.node_id",
    gpu_model: str = "COALESCE(n.gpu_model_id, 0)",
    team: str = "j.team",
    where: str = "true",
) -> str:
    """The start and release events of each allocation of ``source`` (aliased ``a``), as
    ``ef0a1b2c3d9a`` defines them, with their node."""
    joins = f"FROM {source} a JOIN nodes n ON n.id = a.node_id JOIN jobs j ON j.id = a.job_id"
    head = f"SELECT n.cluster_id AS cluster_id, {node} AS node_id, {gpu_model} AS gpu_model_id,"
    start = _AT_US.format(at="a.started_at")
    # A release dated before its start counts as zero length, as the summaries read it.
    end = _AT_US.format(at="GREATEST(a.released_at, a.started_at)")
    return (
        f"{head} {team} AS team, {start} AS at_us, {sign} * a.gpu_count AS gpus,"
        f" {sign} AS opened, 0 AS closed, 0 AS samples, 0.0 AS sample_sum {joins}"
        f" WHERE {where} UNION ALL"
        f" {head} {team} AS team, {end} AS at_us, {-sign} * a.gpu_count AS gpus,"
        f" 0 AS opened, {sign} AS closed, 0 AS samples, 0.0 AS sample_sum {joins}"
        f" WHERE a.released_at IS NOT NULL AND {where}"
    )


def _sample_events(
    source: str,
    sign: int,
    *,
    node: str = "s.node_id",
    gpu_model: str = "COALESCE(n.gpu_model_id, 0)",
    where: str = "true",
) -> str:
    """Each ``gpu_util`` sample of a node in ``source`` (aliased ``s``), with its node."""
    return (
        f"SELECT n.cluster_id AS cluster_id, {node} AS node_id, {gpu_model} AS gpu_model_id,"
        f" '' AS team, {_AT_US.format(at='s.at')} AS at_us, 0 AS gpus, 0 AS opened,"
        f" 0 AS closed, {sign} AS samples, {sign} * s.value AS sample_sum"
        f" FROM {source} s JOIN nodes n ON n.id = s.node_id"
        f" WHERE s.metric = 'gpu_util' AND {where}"
    )


def _unfolded_of_node(sign: int, gpu_model: str) -> str:
    """The node's ``gpu_model`` deltas still to fold, under ``gpu_model``."""
    sums = ", ".join(f"{sign} * {c} AS {c}" for c in _SUMS)
    return (
        f"SELECT cluster_id, NULL::integer AS node_id, {gpu_model} AS gpu_model_id,"
        f" '' AS team, at_us, {sums} FROM utilization_rollup_deltas"
        " WHERE dimension = 'gpu_model' AND node_id = NEW.id"
    )


def _append(events: Sequence[str], dimensions: Sequence[str]) -> str:
    """Append ``events`` as one row per dimension, group and instant (and, for
    ``gpu_model``, node); a group whose sums cancel out (an UPDATE's old and new rows of
    the events it leaves alone) is not written."""
    dimension_rows = " UNION ALL ".join(f"SELECT '{d}' AS dimension" for d in dimensions)
    sums = ", ".join(f"SUM(e.{c})" for c in _SUMS)
    return (
        "INSERT INTO utilization_rollup_deltas (dimension, cluster_id, node_id, gpu_model_id,"
        f" team, at_us, {', '.join(_SUMS)})"
        " SELECT d.dimension, e.cluster_id,"
        " CASE WHEN d.dimension = 'gpu_model' THEN e.node_id END,"
        " CASE WHEN d.dimension = 'gpu_model' THEN e.gpu_model_id ELSE 0 END,"
        f" CASE WHEN d.dimension = 'team' THEN e.team ELSE '' END, e.at_us, {sums}"
        f" FROM ({' UNION ALL '.join(events)}) AS e CROSS JOIN ({dimension_rows}) AS d"
        # Every sum, sample_sum too: a sample whose value changes keeps the count (-1 +1).
        " GROUP BY 1, 2, 3, 4, 5, 6 HAVING " + " OR ".join(f"SUM(e.{c}) <> 0" for c in _SUMS)
    )


def _functions() -> dict[str, str]:
    """Each trigger function's new body."""
    allocation_dimensions, sample_dimensions = (
        ("cluster", "gpu_model", "team"),
        ("cluster", "gpu_model"),
    )
    old_model, new_model = "COALESCE(OLD.gpu_model_id, 0)", "COALESCE(NEW.gpu_model_id, 0)"
    on_node, sampled_on_node = "a.node_id = NEW.id", "s.node_id = NEW.id"
    resolved = "NULL::integer"  # a row whose model is given, not its node's
    return {
        "utilization_rollup_allocations_inserted": _append(
            [_allocation_events("new_rows", 1)], allocation_dimensions
        ),
        # All of both sides: the events a release leaves alone cancel out in the sums.
        "utilization_rollup_allocations_updated": _append(
            [_allocation_events("old_rows", -1), _allocation_events("new_rows", 1)],
            allocation_dimensions,
        ),
        "utilization_rollup_samples_inserted": _append(
            [_sample_events("new_rows", 1)], sample_dimensions
        ),
        # A job's writers lock its row first (the sagas; the ingest updates it), so a
        # write to it commits before this statement begins or reads the new team.
        "utilization_rollup_job_team_changed": _append(
            [
                _allocation_events("allocations", -1, team="OLD.team", where="a.job_id = NEW.id"),
                _allocation_events("allocations", 1, team="NEW.team", where="a.job_id = NEW.id"),
            ],
            ("team",),
        ),
        # What was folded of the node (its events less its deltas still to fold) moves
        # from the old model to the new; what is still to fold follows the node when
        # folded. No fold may commit between this statement's snapshot and this
        # transaction's commit: it would file the node's deltas under the old model.
        "utilization_rollup_node_model_changed": (
            f"PERFORM pg_advisory_xact_lock_shared({ROLLUP_FOLD_LOCK_KEY});\n"
            + _append(
                [
                    _allocation_events("allocations", -1, node=resolved, gpu_model=old_model, where=on_node),
                    _allocation_events("allocations", 1, node=resolved, gpu_model=new_model, where=on_node),
                    _sample_events("telemetry_samples", -1, node=resolved, gpu_model=old_model, where=sampled_on_node),
                    _sample_events("telemetry_samples", 1, node=resolved, gpu_model=new_model, where=sampled_on_node),
                    _unfolded_of_node(1, old_model),
                    _unfolded_of_node(-1, new_model),
                ],
                ("gpu_model",),
            )
        ),
    }  # fmt: skip


def _rollups_revision() -> ModuleType:
    """``ef0a1b2c3d9a``, for the downgrade: its trigger bodies and its upsert. A revision
    never changes once released, so neither do they."""
    path = Path(__file__).with_name("2026_12_04_1000-ef0a1b2c3d9a_utilization_rollups.py")
    spec = importlib.util.spec_from_file_location("_utilization_rollups_ef0a1b2c3d9a", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    op.create_table(
        "utilization_rollup_deltas",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            nullable=False,
        ),
        sa.Column("dimension", sa.String(length=16), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("gpu_model_id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("at_us", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.BigInteger(), nullable=False),
        sa.Column("opened", sa.BigInteger(), nullable=False),
        sa.Column("closed", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("sample_sum", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_utilization_rollup_deltas")),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, body in _functions().items():
        op.execute(
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            f"BEGIN\n{body};\nRETURN NULL;\nEND\n$$"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        rollups = _rollups_revision()
        for statement in rollups._postgres_triggers():  # the old bodies, as replacements
            if statement.startswith("CREATE FUNCTION "):
                op.execute(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
        # Fold what the triggers appended through the old upsert, one dimension at a
        # time (the rows' keys are already the dimension's; a node's rows take its model).
        model = "CASE WHEN n.id IS NULL THEN d.gpu_model_id ELSE COALESCE(n.gpu_model_id, 0) END"
        for dimension in rollups.ALLOCATION_DIMENSIONS:
            events = (
                f"SELECT d.cluster_id, {model} AS gpu_model_id, d.team, d.at_us,"
                f" {', '.join(f'd.{c}' for c in _SUMS)} FROM utilization_rollup_deltas d"
                f" LEFT JOIN nodes n ON n.id = d.node_id WHERE d.dimension = '{dimension}'"
                " AND d.cluster_id IN (SELECT id FROM clusters)"
            )
            op.execute(rollups._upsert("postgresql", [events], (dimension,)))
    op.drop_table("utilization_rollup_deltas")
