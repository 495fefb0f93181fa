"""utilization roll-ups: per-group sums of allocation events and gpu_util samples per
period, kept by triggers, backfilled from the rows already stored

``GET /utilization`` summed every allocation and sample of its window (issue 13's fleet:
seconds a request). ``utilization_rollups`` holds, per group (cluster; cluster and GPU
model; cluster and team) and period, the sums that answer any bucket exactly: the net
change of allocated GPUs and its time moment (an allocation is +GPUs at its start, -GPUs
at its release), allocations opened and closed, and the count and sum of ``gpu_util``
samples. Periods nest: the exact instant of the events (1 µs), 16 s × 4^k up to 65,536 s,
and all time (0). ``app.utilization.rollup`` reads them; ``LEVELS_US`` there must equal
the one here.

Why triggers, not the ingest's Python: allocations are also written by the action sagas
(ORM, ``app.actions.saga``), samples by node agents, and jobs change team and nodes GPU
model in updates the roll-up must follow (today's answer groups history by a job's
current team and a node's current model). A trigger runs in the writer's transaction,
whoever the writer is, so the roll-up is never ahead of or behind the rows it sums, and
an aborted push leaves neither. PostgreSQL runs one statement per INSERT or UPDATE
statement (transition tables: one COPY of 20,000 allocations is one grouped upsert);
SQLite, which has only row triggers, one upsert per row.

Rows are deleted only with their cluster (no code deletes samples, allocations, jobs or
nodes otherwise); a retention job that prunes samples must prune roll-up periods with them
and fold what it prunes into the all-time row.

Revision ID: ef0a1b2c3d9a
Revises: de9f0a1b2c89
Create Date: 2026-12-04 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "ef0a1b2c3d9a"
down_revision: str | None = "de9f0a1b2c89"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0: all time; 1: the exact instant; then 16 s × 4^k (app.utilization.rollup.LEVELS_US).
LEVELS_US = (0, 1, *(16_000_000 * 4**k for k in range(7)))
ALLOCATION_DIMENSIONS = ("cluster", "gpu_model", "team")
SAMPLE_DIMENSIONS = ("cluster", "gpu_model")
_SUMS = ("gpus", "gpu_us", "opened", "closed", "samples", "sample_sum")


def _at_us(dialect: str, at: str) -> str:
    """A timestamp as integer µs since the epoch, exactly (no float on the way)."""
    if dialect == "postgresql":
        return f"(extract(epoch FROM {at}) * 1000000)::bigint"
    # SQLite keeps 'YYYY-MM-DD HH:MM:SS.ffffff' (naive UTC, always six digits).
    return (
        f"(CAST(strftime('%s', {at}) AS INTEGER) * 1000000 + CAST(substr({at}, 21, 6) AS INTEGER))"
    )


def _later(dialect: str, a: str, b: str) -> str:
    # A release dated before its start (clocks of two writers) counts as zero length,
    # as the summaries always read it; SQLite's texts compare in time order.
    return f"GREATEST({a}, {b})" if dialect == "postgresql" else f"max({a}, {b})"


def _allocation_events(
    dialect: str,
    source: str,
    sign: int,
    *,
    parts: tuple[str, ...] = ("start", "end"),
    gpu_model: str = "COALESCE(n.gpu_model_id, 0)",
    team: str = "j.team",
    where: str = "true",
) -> str:
    """The start and/or release events of each allocation of ``source`` (aliased ``a``)."""
    joins = f"FROM {source} a JOIN nodes n ON n.id = a.node_id JOIN jobs j ON j.id = a.job_id"
    end = _later(dialect, "a.released_at", "a.started_at")
    selects = {
        "start": (
            f"SELECT n.cluster_id AS cluster_id, {gpu_model} AS gpu_model_id, {team} AS team,"
            f" {_at_us(dialect, 'a.started_at')} AS at_us, {sign} * a.gpu_count AS gpus,"
            f" {sign} AS opened, 0 AS closed, 0 AS samples, 0.0 AS sample_sum {joins}"
            f" WHERE {where}"
        ),
        "end": (
            f"SELECT n.cluster_id AS cluster_id, {gpu_model} AS gpu_model_id, {team} AS team,"
            f" {_at_us(dialect, end)} AS at_us, {-sign} * a.gpu_count AS gpus,"
            f" 0 AS opened, {sign} AS closed, 0 AS samples, 0.0 AS sample_sum {joins}"
            f" WHERE a.released_at IS NOT NULL AND {where}"
        ),
    }
    return " UNION ALL ".join(selects[part] for part in parts)


_ALLOCATION_COLUMNS = ("node_id", "job_id", "gpu_count", "started_at", "released_at")


def _row(prefix: str, columns: Sequence[str]) -> str:
    """SQLite: the trigger's OLD or NEW row as a one-row table."""
    return "(SELECT " + ", ".join(f"{prefix}.{c} AS {c}" for c in columns) + ")"


# An UPDATE of allocations moves only the events it changes: a release (the common one)
# adds the end and leaves the start alone. SQLite's row trigger skips the rest up front.
_START = ("node_id", "job_id", "gpu_count", "started_at")
_END = (*_START, "released_at")


def _changed(columns: Sequence[str]) -> str:
    """SQLite: whether any of ``columns`` differs between OLD and NEW (IS NOT: NULL-safe)."""
    return "(" + " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in columns) + ")"


def _update_events(dialect: str) -> list[str]:
    """The events an UPDATE of allocations removes (old rows) and adds (new rows)."""
    if dialect == "postgresql":
        # All of both sides: the events a release leaves alone cancel out in _upsert's
        # first sum, which is linear; matching old and new rows by id is a join of two
        # transition tables without statistics (a second for 7,000 rows).
        return [
            _allocation_events(dialect, "old_rows", -1),
            _allocation_events(dialect, "new_rows", 1),
        ]
    old, new = _row("OLD", _ALLOCATION_COLUMNS), _row("NEW", _ALLOCATION_COLUMNS)
    start, end = _changed(_START), _changed(_END)
    return [
        _allocation_events(dialect, old, -1, parts=("start",), where=start),
        _allocation_events(dialect, new, 1, parts=("start",), where=start),
        _allocation_events(dialect, old, -1, parts=("end",), where=end),
        _allocation_events(dialect, new, 1, parts=("end",), where=end),
    ]


def _sample_events(
    dialect: str,
    source: str,
    sign: int,
    *,
    gpu_model: str = "COALESCE(n.gpu_model_id, 0)",
    where: str = "true",
) -> str:
    """Each ``gpu_util`` sample of a node in ``source`` (aliased ``s``)."""
    return (
        f"SELECT n.cluster_id AS cluster_id, {gpu_model} AS gpu_model_id, '' AS team,"
        f" {_at_us(dialect, 's.at')} AS at_us, 0 AS gpus, 0 AS opened, 0 AS closed,"
        f" {sign} AS samples, {sign} * s.value AS sample_sum"
        f" FROM {source} s JOIN nodes n ON n.id = s.node_id"
        f" WHERE s.metric = 'gpu_util' AND {where}"
    )


def _upsert(
    dialect: str, events: Sequence[str], dimensions: Sequence[str], *, grouped: bool = True
) -> str:
    """Add ``events`` (the union of the SELECTs above) into every period of every level
    of ``dimensions``.

    ``grouped``: sum the events per group and instant first (the events of one push share
    its instant, so they are few before they meet the dimensions and levels), and write
    no group whose sums cancel out (an UPDATE's old and new rows). A SQLite row trigger
    has one or two events: each is upserted as it is, which costs less than sorting them.
    """
    dimension_rows = " UNION ALL ".join(f"SELECT '{d}' AS dimension" for d in dimensions)
    level_rows = " UNION ALL ".join(f"SELECT {level} AS period_us" for level in LEVELS_US)
    union = " UNION ALL ".join(events)
    if grouped:
        union = (
            "SELECT cluster_id, gpu_model_id, team, at_us, SUM(gpus) AS gpus,"
            " SUM(opened) AS opened, SUM(closed) AS closed, SUM(samples) AS samples,"
            f" SUM(sample_sum) AS sample_sum FROM ({union}) AS raw"
            " GROUP BY cluster_id, gpu_model_id, team, at_us"
            " HAVING SUM(gpus) <> 0 OR SUM(opened) <> 0 OR SUM(closed) <> 0 OR SUM(samples) <> 0"
        )
    period_start = "CASE WHEN l.period_us = 0 THEN 0 ELSE e.at_us / l.period_us * l.period_us END"
    moment = "CASE WHEN l.period_us = 0 THEN 0 ELSE e.gpus * (e.at_us % l.period_us) END"
    values = ["e.gpus", moment, "e.opened", "e.closed", "e.samples", "e.sample_sum"]
    tail = ""
    if grouped:
        values = [f"SUM({v})" for v in values]
        tail = " GROUP BY 1, 2, 3, 4, 5, 6 HAVING " + " OR ".join(f"{v} <> 0" for v in values[:5])
        if dialect == "postgresql":  # two writers never lock the same rows in opposite orders
            tail += " ORDER BY 1, 2, 3, 4, 5, 6"
    updates = ", ".join(f"{c} = utilization_rollups.{c} + excluded.{c}" for c in _SUMS)
    return (
        "INSERT INTO utilization_rollups (dimension, cluster_id, gpu_model_id, team,"
        f" period_us, period_start_us, {', '.join(_SUMS)})"
        " SELECT d.dimension, e.cluster_id,"
        " CASE WHEN d.dimension = 'gpu_model' THEN e.gpu_model_id ELSE 0 END,"
        " CASE WHEN d.dimension = 'team' THEN e.team ELSE '' END,"
        f" l.period_us, {period_start}, {', '.join(values)}"
        f" FROM ({union}) AS e CROSS JOIN ({dimension_rows}) AS d CROSS JOIN ({level_rows}) AS l"
        f" WHERE true{tail}"
        " ON CONFLICT (dimension, cluster_id, gpu_model_id, team, period_us, period_start_us)"
        f" DO UPDATE SET {updates}"
    )


def _postgres_triggers() -> list[str]:
    pg = "postgresql"
    statements: list[str] = []

    def function(name: str, body: str) -> None:
        statements.append(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            f"BEGIN\n{body};\nRETURN NULL;\nEND\n$$"
        )

    function(
        "utilization_rollup_allocations_inserted",
        _upsert(pg, [_allocation_events(pg, "new_rows", 1)], ALLOCATION_DIMENSIONS),
    )
    function(
        "utilization_rollup_allocations_updated",
        _upsert(pg, _update_events(pg), ALLOCATION_DIMENSIONS),
    )
    function(
        "utilization_rollup_samples_inserted",
        _upsert(pg, [_sample_events(pg, "new_rows", 1)], SAMPLE_DIMENSIONS),
    )
    function(
        "utilization_rollup_job_team_changed",
        _upsert(
            pg,
            [
                _allocation_events(
                    pg, "allocations", -1, team="OLD.team", where="a.job_id = NEW.id"
                ),
                _allocation_events(
                    pg, "allocations", 1, team="NEW.team", where="a.job_id = NEW.id"
                ),
            ],
            ("team",),
        ),
    )
    old_model, new_model = "COALESCE(OLD.gpu_model_id, 0)", "COALESCE(NEW.gpu_model_id, 0)"
    on_node = "a.node_id = NEW.id"
    function(
        "utilization_rollup_node_model_changed",
        _upsert(
            pg,
            [
                _allocation_events(pg, "allocations", -1, gpu_model=old_model, where=on_node),
                _allocation_events(pg, "allocations", 1, gpu_model=new_model, where=on_node),
            ],
            ("gpu_model",),
        )
        + ";\n"
        + _upsert(
            pg,
            [
                _sample_events(pg, "telemetry_samples", -1, gpu_model=old_model, where="s.node_id = NEW.id"),
                _sample_events(pg, "telemetry_samples", 1, gpu_model=new_model, where="s.node_id = NEW.id"),
            ],
            ("gpu_model",),
        ),
    )  # fmt: skip
    statements += [
        "CREATE TRIGGER utilization_rollup_allocations_inserted AFTER INSERT ON allocations"
        " REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT"
        " EXECUTE FUNCTION utilization_rollup_allocations_inserted()",
        "CREATE TRIGGER utilization_rollup_allocations_updated AFTER UPDATE ON allocations"
        " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT"
        " EXECUTE FUNCTION utilization_rollup_allocations_updated()",
        "CREATE TRIGGER utilization_rollup_samples_inserted AFTER INSERT ON telemetry_samples"
        " REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT"
        " EXECUTE FUNCTION utilization_rollup_samples_inserted()",
        "CREATE TRIGGER utilization_rollup_job_team_changed AFTER UPDATE OF team ON jobs"
        " FOR EACH ROW WHEN (OLD.team IS DISTINCT FROM NEW.team)"
        " EXECUTE FUNCTION utilization_rollup_job_team_changed()",
        "CREATE TRIGGER utilization_rollup_node_model_changed AFTER UPDATE OF gpu_model_id"
        " ON nodes FOR EACH ROW WHEN (OLD.gpu_model_id IS DISTINCT FROM NEW.gpu_model_id)"
        " EXECUTE FUNCTION utilization_rollup_node_model_changed()",
    ]
    return statements


def _sqlite_triggers() -> list[str]:
    lite = "sqlite"
    sample = ("node_id", "metric", "at", "value")

    def trigger(name: str, event: str, *bodies: str) -> str:
        return f"CREATE TRIGGER {name} AFTER {event} BEGIN " + "; ".join(bodies) + "; END"

    old_model, new_model = "COALESCE(OLD.gpu_model_id, 0)", "COALESCE(NEW.gpu_model_id, 0)"
    return [
        trigger(
            "utilization_rollup_allocations_inserted",
            "INSERT ON allocations",
            _upsert(lite, [_allocation_events(lite, _row("NEW", _ALLOCATION_COLUMNS), 1)],
                    ALLOCATION_DIMENSIONS, grouped=False),
        ),
        trigger(
            "utilization_rollup_allocations_updated",
            "UPDATE ON allocations",
            _upsert(lite, _update_events(lite), ALLOCATION_DIMENSIONS, grouped=False),
        ),
        trigger(
            "utilization_rollup_samples_inserted",
            "INSERT ON telemetry_samples",
            _upsert(lite, [_sample_events(lite, _row("NEW", sample), 1)], SAMPLE_DIMENSIONS,
                    grouped=False),
        ),
        trigger(
            "utilization_rollup_job_team_changed",
            "UPDATE OF team ON jobs FOR EACH ROW WHEN OLD.team IS NOT NEW.team",
            _upsert(
                lite,
                [
                    _allocation_events(lite, "allocations", -1, team="OLD.team", where="a.job_id = NEW.id"),
                    _allocation_events(lite, "allocations", 1, team="NEW.team", where="a.job_id = NEW.id"),
                ],
                ("team",),
            ),
        ),
        trigger(
            "utilization_rollup_node_model_changed",
            "UPDATE OF gpu_model_id ON nodes FOR EACH ROW"
            " WHEN OLD.gpu_model_id IS NOT NEW.gpu_model_id",
            _upsert(
                lite,
                [
                    _allocation_events(lite, "allocations", -1, gpu_model=old_model, where="a.node_id = NEW.id"),
                    _allocation_events(lite, "allocations", 1, gpu_model=new_model, where="a.node_id = NEW.id"),
                ],
                ("gpu_model",),
            ),
            _upsert(
                lite,
                [
                    _sample_events(lite, "telemetry_samples", -1, gpu_model=old_model, where="s.node_id = NEW.id"),
                    _sample_events(lite, "telemetry_samples", 1, gpu_model=new_model, where="s.node_id = NEW.id"),
                ],
                ("gpu_model",),
            ),
        ),
    ]  # fmt: skip


_TRIGGERS = {
    "utilization_rollup_allocations_inserted": "allocations",
    "utilization_rollup_allocations_updated": "allocations",
    "utilization_rollup_samples_inserted": "telemetry_samples",
    "utilization_rollup_job_team_changed": "jobs",
    "utilization_rollup_node_model_changed": "nodes",
}


def upgrade() -> None:
    op.create_table(
        "utilization_rollups",
        sa.Column("dimension", sa.String(length=16), nullable=False),
        sa.Column(
            "cluster_id",
            sa.Integer(),
            sa.ForeignKey(
                "clusters.id",
                name=op.f("fk_utilization_rollups_cluster_id_clusters"),
                ondelete="CASCADE",
            ),
            nullable=False,
        ),
        sa.Column("gpu_model_id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("period_us", sa.BigInteger(), nullable=False),
        sa.Column("period_start_us", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.BigInteger(), nullable=False),
        sa.Column("gpu_us", sa.BigInteger(), nullable=False),
        sa.Column("opened", sa.BigInteger(), nullable=False),
        sa.Column("closed", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("sample_sum", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "dimension",
            "cluster_id",
            "gpu_model_id",
            "team",
            "period_us",
            "period_start_us",
            name=op.f("pk_utilization_rollups"),
        ),
    )
    op.create_index(
        "ix_utilization_rollups_period",
        "utilization_rollups",
        ["dimension", "period_us", "period_start_us"],
    )
    dialect = op.get_bind().dialect.name
    # Backfill first, in the same transaction as the triggers: rows written later are
    # the triggers' (migrations run before the service starts).
    op.execute(_upsert(dialect, [_allocation_events(dialect, "allocations", 1)],
                       ALLOCATION_DIMENSIONS))  # fmt: skip
    op.execute(
        _upsert(dialect, [_sample_events(dialect, "telemetry_samples", 1)], SAMPLE_DIMENSIONS)
    )
    for statement in _postgres_triggers() if dialect == "postgresql" else _sqlite_triggers():
        op.execute(statement)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name, table in _TRIGGERS.items():
        op.execute(f"DROP TRIGGER {name} ON {table}" if postgres else f"DROP TRIGGER {name}")
        if postgres:
            op.execute(f"DROP FUNCTION {name}()")
    op.drop_index("ix_utilization_rollups_period", table_name="utilization_rollups")
    op.drop_table("utilization_rollups")
