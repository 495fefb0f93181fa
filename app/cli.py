"""The ``shaper`` command: serve, worker, beat, db, token, audit, diagnose,
forecast-accuracy, demo, sim, agent, connector."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from sqlmodel import Session

from agent.cli import agent_cli
from app.audit.models import Actor
from app.core.config import MIN_SAMPLE_RETENTION_DAYS, get_settings
from sim.cli import sim_app
from wire.queues import CONTROL_QUEUE

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Shaper: compute-shaping control plane for GPU and HPC clusters.",
    # No local variables in a crash's traceback (settings, tokens and database URLs are
    # locals of these commands): older Typer releases (pyproject allows 0.12) printed
    # them by default.
    pretty_exceptions_show_locals=False,
)
db_cli = typer.Typer(no_args_is_help=True, help="Database schema (Alembic).")
token_cli = typer.Typer(no_args_is_help=True, help="API tokens.")
cli.add_typer(db_cli, name="db")
cli.add_typer(token_cli, name="token")
cli.add_typer(agent_cli, name="agent")
cli.add_typer(sim_app, name="sim", help="Trace-driven simulator and what-if replay.")
console = Console(stderr=True)


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Default: SHAPER_HOST (127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Default: SHAPER_PORT (8000)")] = None,
) -> None:
    """Migrate the database and serve the API and dashboard."""
    import uvicorn

    from app.bootstrap import prepare_database
    from app.core.logging import configure_logging
    from app.main import create_app

    settings = get_settings()
    if host is not None:
        settings = settings.model_copy(update={"host": host})
        type(settings).model_validate(settings.model_dump())  # re-run the bind-safety check
    configure_logging(settings.log_level, settings.log_format)
    prepare_database(settings)
    from app.worker import start_in_process_beat

    start_in_process_beat(settings)  # the embedded default's periodic tasks
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=port or settings.port,
        log_level=settings.log_level.lower(),
    )


_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _celery_app() -> object:
    """The control plane's Celery app, refusing the embedded default (no broker)."""
    if not get_settings().broker_url:
        console.print(
            "SHAPER_BROKER_URL is not set: the embedded default runs tasks inside `shaper serve`"
            " and needs no worker; set it (e.g. redis://127.0.0.1:6379/0) to run workers"
        )
        raise typer.Exit(2)
    from app.core.logging import configure_logging
    from app.worker import celery_app

    configure_logging(get_settings().log_level, get_settings().log_format)
    return celery_app


@cli.command(context_settings=_PASS_THROUGH)
def worker(
    ctx: typer.Context,
    queues: Annotated[str, typer.Option(help="comma-separated queues to consume")] = CONTROL_QUEUE,
    beat: Annotated[
        bool, typer.Option(help="also fire the periodic tasks (one such process per site)")
    ] = False,
    schedule: Annotated[str | None, typer.Option(help="beat schedule file (with --beat)")] = None,
    pool: Annotated[str, typer.Option(help="prefork | solo | threads")] = "prefork",
    concurrency: Annotated[int | None, typer.Option(min=1)] = None,
    loglevel: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run a control-plane Celery worker (needs SHAPER_BROKER_URL). Arguments after the
    options go to Celery's worker unchanged (e.g. --without-gossip)."""
    app = _celery_app()
    argv = ["worker", "-Q", queues, "-n", f"{queues.split(',')[0]}@%h", "--pool", pool]
    argv += ["-l", loglevel]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if beat:
        argv.append("--beat")
        if schedule:
            argv += ["-s", schedule]
    app.worker_main([*argv, *ctx.args])  # type: ignore[attr-defined]


@cli.command(context_settings=_PASS_THROUGH)
def beat(
    ctx: typer.Context,
    schedule: Annotated[str | None, typer.Option(help="beat schedule file")] = None,
    loglevel: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Fire the periodic tasks (shaping cycles, action sweep, stale connectors, roll-up
    folding, sample retention) on the broker, for workers to run (needs
    SHAPER_BROKER_URL). One per site."""
    app = _celery_app()
    argv = ["beat", "-l", loglevel, *(["-s", schedule] if schedule else []), *ctx.args]
    app.start(argv)  # type: ignore[attr-defined]


@db_cli.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from app.core import migrate

    migrate.upgrade(get_settings().resolved_database_url, revision)


@db_cli.command("downgrade")
def db_downgrade(revision: str) -> None:
    """Revert migrations down to REVISION (e.g. -1, base)."""
    from app.core import migrate

    migrate.downgrade(get_settings().resolved_database_url, revision)


@db_cli.command("prune-samples")
def db_prune_samples(
    older_than_days: Annotated[
        int | None,
        typer.Option(min=1, help="Default: SHAPER_SAMPLE_RETENTION_DAYS (35); at least 32"),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Allow --older-than-days under 32 (the idle diagnosis reads 31 days)"
        ),
    ] = False,
) -> None:
    """Fold the utilization roll-up's deltas, then delete node samples older than the
    retention age, all of them (the periodic task does at most a million an hour), and
    compact the roll-up's exact instants over the same age (all of its history).
    GET /utilization answers their periods from the roll-up, unchanged over windows and
    buckets whose edges are multiples of 16 s."""
    from datetime import timedelta

    from app.bootstrap import prepare_database
    from app.core.clock import SystemClock
    from app.core.db import get_engine
    from app.utilization import fold, retention

    settings = get_settings()
    days = older_than_days or settings.sample_retention_days
    if days < MIN_SAMPLE_RETENTION_DAYS and not force:
        console.print(
            f"[red]--older-than-days {days} is under {MIN_SAMPLE_RETENTION_DAYS}:[/red] the idle"
            " diagnosis reads samples up to 31 days back and would call busy GPUs idle."
            " Nothing deleted; give --force to delete them anyway."
        )
        raise typer.Exit(2)
    prepare_database(settings)
    now = SystemClock().now()
    with Session(get_engine()) as session:
        folded = 0
        while moved := fold.fold_deltas(session=session):
            folded += moved
        deleted = retention.prune_samples(
            session=session, now=now, older_than=timedelta(days=days), max_batches=None
        )
        compacted = retention.compact_rollups(
            session=session, before=now - timedelta(days=days), max_batches=None
        )
    console.print(
        f"folded {folded} roll-up deltas; deleted {deleted} samples older than {days} d;"
        f" compacted {compacted} roll-up rows"
    )


@token_cli.command("create")
def token_create(
    scope: Annotated[
        list[str],
        typer.Option(
            "--scope", help="viewer, operator, admin, connector:<cluster>, agent:<cluster>/<node>"
        ),
    ],
    name: Annotated[str, typer.Option(help="Who or what holds it")] = "cli",
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from pydantic import ValidationError

    from app.bootstrap import prepare_database
    from app.core.clock import SystemClock
    from app.core.db import get_engine
    from app.tokens import service
    from app.tokens.models import ApiTokenCreate

    try:
        token_in = ApiTokenCreate(name=name, scopes=scope)
    except ValidationError as exc:
        console.print(f"[red]invalid token request:[/red] {exc.errors()[0]['msg']}")
        raise typer.Exit(2) from None
    prepare_database(get_settings())
    with Session(get_engine()) as session:
        created = service.create_token(
            session=session, token_in=token_in, now=SystemClock().now(), actor=_local_actor()
        )
    console.print(f"token {created.key_id} ({', '.join(created.scopes)}) — shown once:")
    print(created.token)


@token_cli.command("list")
def token_list() -> None:
    """List tokens (never their secrets)."""
    from app.bootstrap import prepare_database
    from app.core.db import get_engine
    from app.tokens import service

    prepare_database(get_settings())
    with Session(get_engine()) as session:
        for token in service.list_tokens(session=session):
            state = "revoked" if token.revoked_at else "active"
            print(f"{token.id}\t{token.key_id}\t{token.name}\t{','.join(token.scopes)}\t{state}")


def _local_actor() -> Actor:
    """Who the audit log names for a change made on this host's command line."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = "unknown"
    return Actor(token_id=None, name=f"cli:{user}"[:128], scopes=("local",))


@cli.command()
def audit(
    object_type: Annotated[
        str | None,
        typer.Option("--type", help="token, cluster, gpu_model, sla_policy, action, plan"),
    ] = None,
    object_id: Annotated[str | None, typer.Option("--id", help="the object's id or name")] = None,
    actor: Annotated[str | None, typer.Option(help="the token's name")] = None,
    since: Annotated[
        datetime | None, typer.Option(help="inclusive, UTC (2026-12-03T08:00:00)")
    ] = None,
    until: Annotated[datetime | None, typer.Option(help="exclusive, UTC")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
) -> None:
    """List the audit log, newest first: when, who (token id, name), what, which object,
    what changed (the same records as GET /api/v1/audit)."""
    import json

    from app.audit import service
    from app.audit.service import AuditObject
    from app.bootstrap import prepare_database
    from app.core.db import get_engine
    from app.core.errors import Invalid

    try:
        kind = AuditObject(object_type) if object_type is not None else None
    except ValueError:
        console.print(
            f"[red]--type:[/red] {object_type!r} is not one of "
            f"{', '.join(o.value for o in AuditObject)}"
        )
        raise typer.Exit(2) from None
    prepare_database(get_settings())  # a fresh data directory has an empty log, not an error
    with Session(get_engine()) as session:
        try:
            page = service.list_records(
                session=session,
                object_type=kind,
                object_id=object_id,
                actor=actor,
                since=_utc(since),
                until=_utc(until),
                limit=limit,
            )
        except Invalid as exc:
            console.print(f"[red]{exc.message}[/red]")
            raise typer.Exit(2) from None
    for item in page.items:
        who = f"{item.actor_token_id or '-'}:{item.actor_name}"
        changes = json.dumps(item.changes, separators=(",", ":"), sort_keys=True)
        print(f"{item.at.isoformat()}\t{who}\t{item.action}\t{item.object_id}\t{changes}")
    console.print(f"{len(page.items)} of {page.total} records")


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


@cli.command()
def diagnose(
    cluster: Annotated[str, typer.Option(help="the cluster's name")],
    hours: Annotated[float, typer.Option(min=0.01, max=31 * 24, help="the window's length")] = 24,
    until: Annotated[
        datetime | None, typer.Option(help="the window's end, UTC (default: now)")
    ] = None,
    busy_threshold: Annotated[
        float, typer.Option(min=0.001, max=1.0, help="allocated GPUs busy below this are idle")
    ] = 0.1,
) -> None:
    """Why the cluster's GPUs were idle: GPU-hours and share per cause, by GPU model and
    by team (the same figures as GET /api/v1/diagnosis)."""
    from datetime import timedelta

    from app.bootstrap import prepare_database
    from app.core.clock import SystemClock
    from app.core.db import get_engine
    from app.core.errors import Invalid, NotFound
    from app.diagnosis import service
    from app.diagnosis.report import print_diagnosis

    end = _utc(until) or SystemClock().now()
    prepare_database(get_settings())
    with Session(get_engine()) as session:
        try:
            result = service.diagnose(
                session=session,
                cluster=cluster,
                since=end - timedelta(hours=hours),
                until=end,
                busy_threshold=busy_threshold,
            )
        except (Invalid, NotFound) as exc:
            console.print(f"[red]{exc.message}[/red]")
            raise typer.Exit(2) from None
    print_diagnosis(result, Console())


@cli.command("forecast-accuracy")
def forecast_accuracy(
    cluster: Annotated[
        str | None, typer.Option(help="the cluster's name (default: every cluster)")
    ] = None,
    hours: Annotated[int, typer.Option(min=1, max=30 * 24, help="the window's length")] = 24,
) -> None:
    """How good the shaping cycle's live forecasts were: per service, the next-hour demand
    forecast's error, bias and coverage against seasonal-naive, and the same by lead time
    (1 h … 5 h, the solver's look-ahead); per cluster, run-time predictions against the
    team's median (the same figures as GET /api/v1/forecast-accuracy)."""
    from app.bootstrap import prepare_database
    from app.core.clock import SystemClock
    from app.core.db import get_engine
    from app.core.errors import Invalid, NotFound
    from app.forecasts import service
    from app.forecasts.report import print_accuracy

    prepare_database(get_settings())
    with Session(get_engine()) as session:
        try:
            result = service.accuracy(
                session=session, now=SystemClock().now(), window_h=hours, cluster=cluster
            )
        except (Invalid, NotFound) as exc:
            console.print(f"[red]{exc.message}[/red]")
            raise typer.Exit(2) from None
    print_accuracy(result, Console())


@cli.command()
def demo(
    port: Annotated[int, typer.Option()] = 8000,
    reset: Annotated[bool, typer.Option(help="Delete the demo database first")] = False,
) -> None:
    """Run the service and dashboard on the embedded default with a demo site."""
    from app.demo import run_demo

    run_demo(port=port, reset=reset)


@cli.command(
    "connector",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def connector(ctx: typer.Context) -> None:
    """Run a connector next to its scheduler: `shaper connector run --kind slurm --cluster NAME
    --control-plane URL --token … [--broker URL]` (with a broker it also serves action steps on
    connector.<cluster>; see `shaper connector run --help`). `shaper connector import-policies
    --kind kueue --cluster NAME --control-plane URL` imports the site's Kueue ClusterQueues as
    the cluster's SLA policy (see `shaper connector import-policies --help`)."""
    args = list(ctx.args)
    if args and args[0] == "import-policies":
        from connectors.import_policies import main as import_policies

        raise typer.Exit(import_policies(args[1:]))
    if not args or args[0] != "run":
        console.print(
            "usage: shaper connector run --kind KIND --cluster NAME "
            "--control-plane URL [--token T] [--interval S] [--set key=value …] "
            "[--broker URL [--state-dir DIR] [--actions-only]]\n"
            "       shaper connector import-policies --kind kueue --cluster NAME "
            "--control-plane URL [--token T] [--set kubeconfig=PATH] [--cluster-queue CQ …] "
            "[--selector LABELS] [--policy NAME] [--replace] [--dry-run]"
        )
        raise typer.Exit(2)
    from connectors.runner import main as run_connector

    raise typer.Exit(run_connector(args[1:]))


def main() -> None:
    cli()
