"""`shaper agent exec -- CMD` and `shaper agent ps`: workloads under the agent's management.

app/cli.py mounts this as `cli.add_typer(agent_cli, name="agent")`; `python -m agent`
runs it on its own. Each command reads the environment once (agent.settings.AgentSettings)
and passes what it needs down.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.backends import BACKEND_NAMES
from agent.settings import TOKEN_ENV, AgentSettings
from agent.workload import WorkloadStartFailed, WorkloadStore, start_workload

if TYPE_CHECKING:
    from agent.kubelet import KubeletCheckpointer

# No local variables in a crash's traceback (settings and tokens are locals here): older
# Typer releases (pyproject allows 0.12) printed them by default.
agent_cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The node agent.",
    pretty_exceptions_show_locals=False,
)

StateDir = Annotated[
    Path | None,
    typer.Option(
        help="Agent state directory. Default: $SHAPER_AGENT_STATE_DIR or /var/lib/shaper/agent"
    ),
]


def _backend_options(criu: str | None) -> dict[str, dict[str, Any]]:
    """Constructor options by backend name: the criu binary when one is configured."""
    return {"criu": {"criu": criu}} if criu else {}


@agent_cli.command(
    "exec", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True}
)
def exec_(
    command: Annotated[list[str], typer.Argument(help="The command, after --")],
    backend: Annotated[str, typer.Option(help=f"One of {', '.join(BACKEND_NAMES)}")] = "criu",
    workload_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="Default: $SLURM_JOB_ID inside a Slurm job (the id the control plane knows "
            "the job by), else generated",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Stay in the foreground as the body of a scheduler's job: resume from a "
            "checkpoint staged on this node if there is one, wait while the workload runs "
            "and exit with its status",
        ),
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Start CMD under management, so it can be checkpointed and moved later.

    Without --wait: start it detached and print the workload record (JSON): id, PID, log
    file, checkpoint path. With --wait (in a batch script): see agent.foreground.
    """
    if backend not in BACKEND_NAMES or backend == "sim":
        raise typer.BadParameter(f"{backend!r}: use criu or signal", param_hint="--backend")
    settings = AgentSettings()
    workload_id = workload_id or settings.slurm_job_id
    if wait and workload_id is None:
        raise typer.BadParameter(
            "--wait needs --id (or $SLURM_JOB_ID): the id the control plane knows the job by",
            param_hint="--id",
        )
    store = WorkloadStore(state_dir or settings.state_dir)
    try:
        if wait:
            from agent import foreground

            assert workload_id is not None  # --wait without an id was refused above
            status = foreground.run(
                store=store,
                command=command,
                backend=backend,
                workload_id=workload_id,
                backend_options=_backend_options(settings.criu),
            )
        else:
            workload = start_workload(
                store=store, command=command, backend=backend, workload_id=workload_id
            )
    except (WorkloadStartFailed, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    if wait:
        raise typer.Exit(status)
    typer.echo(workload.model_dump_json(indent=2, exclude={"spec": {"env"}}))


@agent_cli.command("ps")
def ps(state_dir: StateDir = None) -> None:
    """List managed workloads: id, backend, state, PID, whether it runs, command."""
    for workload in WorkloadStore(state_dir or AgentSettings().state_dir).all():
        alive = "alive" if workload.is_running() else "gone"
        typer.echo(
            f"{workload.id}\t{workload.backend}\t{workload.state.value}\t{workload.pid}\t"
            f"{alive}\t{' '.join(workload.spec.command)}"
        )


@agent_cli.command("worker")
def worker(
    cluster: Annotated[str, typer.Option(help="The cluster this node belongs to")],
    node: Annotated[str, typer.Option(help="This node's name in its cluster")],
    broker: Annotated[
        str | None,
        typer.Option(help="Celery broker URL. Default: $SHAPER_BROKER_URL", show_default=False),
    ] = None,
    state_dir: StateDir = None,
    criu: Annotated[
        str | None, typer.Option(help="criu binary. Default: $SHAPER_CRIU, PATH, /usr/local/sbin")
    ] = None,
    token_env: Annotated[
        str, typer.Option(help="Environment variable holding this node's agent:C/N token")
    ] = TOKEN_ENV,
    log_level: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run the node agent: a Celery worker on queue agent.<cluster>.<node> that checkpoints,
    transfers, restores, confirms and releases workloads for the control plane's sagas,
    refusing steps with a stale fencing token."""

    from agent.steps import StepExecutor
    from wire.executor import make_executor_app, run_executor_worker
    from wire.queues import agent_queue
    from wire.redaction import log_to_stderr
    from wire.steps import AgentStep

    settings = AgentSettings()
    broker_url = broker or settings.broker_url
    if not broker_url:
        typer.echo("error: --broker or $SHAPER_BROKER_URL is required", err=True)
        raise typer.Exit(2)
    token = settings.token_in(token_env)
    if not token:
        typer.echo(
            f"error: ${token_env} must hold this node's token "
            f"(shaper token create --scope agent:{cluster}/{node})",
            err=True,
        )
        raise typer.Exit(2)
    log_to_stderr(log_level.upper())
    executor = StepExecutor(
        store=WorkloadStore(state_dir or settings.state_dir),
        cluster=cluster,
        node=node,
        backend_options=_backend_options(criu or settings.criu),
    )
    # Answers go with this node's token (scope agent:<cluster>/<node>): the control plane
    # accepts a step's answer only from the node it was sent to. One step at a time, in
    # this process, which owns the workloads it starts (the signal backend's restored
    # workloads are its children); the fence journal makes a redelivered step harmless.
    queue = agent_queue(cluster, node)
    app = make_executor_app(
        broker=broker_url, queue=queue, steps=AgentStep, handle=executor.handle, token=token
    )
    run_executor_worker(app, queue=queue, loglevel=log_level.upper())


@agent_cli.command("telemetry")
def telemetry(
    cluster: Annotated[str, typer.Option(help="The cluster this node belongs to")],
    node: Annotated[str, typer.Option(help="This node's name in its cluster")],
    control_plane: Annotated[str, typer.Option(help="e.g. http://127.0.0.1:8000")],
    interval: Annotated[float, typer.Option(help="Seconds between samples")] = 15.0,
    token_env: Annotated[
        str, typer.Option(help="Environment variable holding this node's agent:C/N token")
    ] = TOKEN_ENV,
) -> None:
    """Report this node's CPU and memory (and GPUs through NVML) to the control plane."""

    from agent.telemetry import run
    from wire.redaction import log_to_stderr

    token = AgentSettings().token_in(token_env)
    if not token:
        typer.echo(
            f"error: ${token_env} must hold this node's agent:{cluster}/{node} token", err=True
        )
        raise typer.Exit(2)
    log_to_stderr("INFO")
    run(control_plane=control_plane, cluster=cluster, node=node, token=token, interval_s=interval)


def _settings() -> AgentSettings:
    from pydantic import ValidationError

    try:
        return AgentSettings()
    except ValidationError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


def _checkpointer(settings: AgentSettings, node: str, state_dir: Path) -> KubeletCheckpointer:
    from agent.kubelet import KubeletAccess, KubeletCheckpointer

    return KubeletCheckpointer(
        node=node,
        kubelet=KubeletAccess(
            url=settings.kubelet_url,
            server_name=settings.kubelet_server_name,
            ca=settings.kubelet_ca,
            client_cert=settings.kubelet_client_cert,
            client_key=settings.kubelet_client_key,
            token_file=settings.kubelet_token_file,
            insecure=settings.kubelet_insecure,
        ),
        ctr=settings.ctr,
        containerd_address=settings.containerd_address,
        repository=settings.checkpoint_image_repository,
        work_dir=state_dir / "kubelet-checkpoints",
    )


@agent_cli.command("api")
def api(
    node: Annotated[str, typer.Option(help="This node's name in its cluster (the Node's)")],
    host: Annotated[
        str, typer.Option(help="Address to listen on; in a pod on the host network: 0.0.0.0")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8470,
    state_dir: StateDir = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Serve the node agent's HTTP API: kubelet checkpoints of this node's pods, imported
    into its containerd as checkpoint images (agent.api, agent.kubelet), and sweep the
    images no longer needed every $SHAPER_CHECKPOINT_IMAGE_GC_INTERVAL_S (agent.image_gc).
    The kubelet, containerd and the API's token come from the environment
    (agent.settings)."""
    import logging

    from agent.api import make_server
    from agent.image_gc import CheckpointImageCollector, start_sweeping
    from wire.redaction import log_to_stderr

    settings = _settings()
    if not settings.api_token:
        typer.echo("error: $SHAPER_AGENT_API_TOKEN must hold the token callers send", err=True)
        raise typer.Exit(2)
    log_to_stderr(log_level.upper())
    state = state_dir or settings.state_dir
    checkpointer = _checkpointer(settings, node, state)
    server = make_server(
        host,
        port,
        checkpointer=checkpointer,
        token=settings.api_token,
        tls_cert=settings.api_tls_cert,
        tls_key=settings.api_tls_key,
    )
    scheme = "https" if settings.api_tls_cert else "http"
    logging.getLogger("agent.api").info(
        "serving %s://%s:%d for node %s (kubelet %s)",
        scheme,
        *server.server_address[:2],
        node,
        settings.kubelet_url,
    )
    sweeping = None
    if settings.checkpoint_image_gc_interval_s > 0:
        collector = CheckpointImageCollector(
            checkpointer, state_dir=state, ttl_s=settings.checkpoint_image_ttl_s
        )
        sweeping = start_sweeping(collector, settings.checkpoint_image_gc_interval_s)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if sweeping is not None:
            sweeping[1].set()
        server.server_close()
        checkpointer.close()


@agent_cli.command("gc-checkpoints")
def gc_checkpoints(
    node: Annotated[str, typer.Option(help="This node's name in its cluster (the Node's)")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing")
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Remove the checkpoint images this node's agent imported that are no longer needed:
    unused by any container or pod of the node and older than
    $SHAPER_CHECKPOINT_IMAGE_TTL_S (agent.image_gc). Prints
    one line per image of the agent's: removed or kept, and why. Exit 1 when the node
    could not say what is in use or a removal failed."""

    from agent.image_gc import CheckpointImageCollector
    from wire.redaction import log_to_stderr

    settings = _settings()
    log_to_stderr("INFO")
    checkpointer = _checkpointer(settings, node, state_dir or settings.state_dir)
    try:
        collector = CheckpointImageCollector(
            checkpointer,
            state_dir=state_dir or settings.state_dir,
            ttl_s=settings.checkpoint_image_ttl_s,
        )
        sweep = collector.sweep(dry_run=dry_run)
    finally:
        checkpointer.close()
    if sweep.error is not None:
        typer.echo(f"error: {sweep.error}", err=True)
        raise typer.Exit(1)
    verb = "would remove" if dry_run else "removed"
    for name, why in sorted(sweep.removed.items()):
        typer.echo(f"{verb}\t{name}\t{why}")
    for name, why in sorted(sweep.kept.items()):
        typer.echo(f"kept\t{name}\t{why}")
    for name, error in sorted(sweep.failed.items()):
        typer.echo(f"failed\t{name}\t{error}", err=True)
    if sweep.failed:
        raise typer.Exit(1)
