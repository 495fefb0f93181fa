"""Connector benchmark: the Kubernetes connector on 1,000 kwok nodes × 8 GPUs and 10,000 pods.

Against a real control plane from ``scripts/k8s-cluster.sh`` (etcd, kube-apiserver,
controller manager, scheduler, kwok, Kueue; binaries from ``scripts/k8s-build.sh``) it
creates the nodes (kwok plays their kubelets) and the pods, then measures, next to the
issue's targets:

1. **In process** (``KubernetesConnector`` and nothing else): time from construction to
   the first ``read_state`` (every informer listed), and the latency of a pod change
   (a pod created, bound to a node) until ``read_state`` shows it, woken by
   ``wait_for_change`` as the runner is. Also a warm ``read_state`` (incremental) beside a
   whole translation of the caches (``rebuild_state``), and whether the two agree.
2. **The real connector process** (``python -m connectors.runner --kind kubernetes``)
   pushing to the real API (uvicorn, a scratch PostgreSQL database; bench.connector_push):
   time from the process's start to the first snapshot stored by the control plane, the
   latency of a pod change until the control plane has the job, and the process's memory
   (RSS now and its peak, VmHWM). ``bench/slurm_connector.py`` measures the same of the
   Slurm connector.

Pods are bare pods with ``spec.nodeName`` set, created by a thread pool: through
Deployments the controller manager (20 requests/s by default) and the scheduler would
take minutes to make 10,000. Each asks for one GPU; 90 % of the GPUs are taken, pods
beyond that stay Pending on a node selector nothing matches.

    python -m bench.connectors [--nodes 1000] [--pods 10000] [--changes 40] [--skip-push]

Environment: SHAPER_K8S_PORT_BASE (the cluster's ports, as scripts/k8s-cluster.sh),
SHAPER_TEST_POSTGRES_DSN (the PostgreSQL server for the scratch database).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.connector_push import (
    CHANGE_P99_TARGET_S,
    FIRST_SNAPSHOT_TARGET_S,
    MEMORY_TARGET_MIB,
    measure_pushed,
    p99,
    verdict,
)
from bench.scratch_db import DEFAULT_DSN
from connectors.kubernetes import KubernetesConnector, KubernetesConnectorConfig
from wire.telemetry import ClusterState, SchedulerKind, TelemetrySnapshot

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "k8s-cluster.sh"
NAMESPACE = "bench"
CLUSTER = "bench-k8s"
GPU = "nvidia.com/gpu"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
WORKERS = 8
console = Console()


# --- the cluster -----------------------------------------------------------------------------


@contextmanager
def k8s_cluster(directory: Path, keep: bool) -> Iterator[Path]:
    """``scripts/k8s-cluster.sh start`` with no nodes (the bench makes its own); stopped at
    the end unless ``keep``. Yields the admin kubeconfig."""
    started = time.monotonic()
    done = subprocess.run(
        [str(SCRIPT), "start", "--dir", str(directory), "--nodes", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the Kubernetes control plane did not start:\n{done.stderr}")
    console.print(f"control plane up in {time.monotonic() - started:.0f} s ({directory})")
    try:
        yield directory / "kubeconfig"
    finally:
        if keep:
            console.print(f"kept: {SCRIPT} stop --dir {directory}")
        else:
            subprocess.run([str(SCRIPT), "stop", "--dir", str(directory)], check=False)
            shutil.rmtree(directory, ignore_errors=True)


def node_body(name: str, gpus: int) -> dict[str, Any]:
    """A kwok GPU node as scripts/k8s-cluster.sh makes them (GFD labels, nvidia.com/gpu)."""
    resources = {"cpu": "64", "memory": "1Ti", "pods": "110", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def pod_body(name: str, node: str | None) -> dict[str, Any]:
    resources = {"cpu": "1", "memory": "1Gi", GPU: "1"}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "train",
                "image": "registry.example/train:1",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
        "restartPolicy": "Never",
    }
    if node:
        spec["nodeName"] = node
    else:
        spec["nodeSelector"] = {"shaper.io/bench": "nowhere"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def in_parallel(what: str, count: int, make: Callable[[int], object]) -> float:
    """``make(i)`` for i < count on a thread pool, with a progress bar; seconds taken."""
    started = time.monotonic()
    with Progress(console=console, transient=True) as progress, ThreadPoolExecutor(WORKERS) as pool:
        task = progress.add_task(what, total=count)
        for _ in pool.map(make, range(count)):
            progress.advance(task)
    return time.monotonic() - started


def populate(core: client.CoreV1Api, nodes: int, gpus: int, pods: int) -> list[str]:
    """The nodes and pods; returns the node names."""
    names = [f"kwok-gpu-{i + 1}" for i in range(nodes)]
    took = in_parallel(
        f"creating {nodes} nodes", nodes, lambda i: core.create_node(node_body(names[i], gpus))
    )
    console.print(f"{nodes} nodes × {gpus} GPUs created in {took:.1f} s")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    bound = min(pods, int(nodes * gpus * 0.9))

    def create_pod(i: int) -> object:
        node = names[i // gpus] if i < bound else None
        return core.create_namespaced_pod(NAMESPACE, pod_body(f"p-{i:06d}", node))

    took = in_parallel(f"creating {pods} pods", pods, create_pod)
    console.print(
        f"{pods} pods created in {took:.1f} s ({pods / took:.0f}/s; {bound} bound, "
        f"{pods - bound} pending)"
    )
    return names


def wait_running(core: client.CoreV1Api, expected: int, timeout_s: float = 900) -> None:
    """Until kwok has played every bound pod to Running, so the measurements see a quiet
    cluster rather than 10,000 status updates in flight."""
    deadline = time.monotonic() + timeout_s
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("kwok: pods Running", total=expected)
        while True:
            # Counted whole: the API server gives no remainingItemCount with a field selector.
            running = len(
                core.list_namespaced_pod(NAMESPACE, field_selector="status.phase=Running").items
            )
            progress.update(task, completed=running)
            if running >= expected:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"only {running}/{expected} pods Running after {timeout_s} s")
            time.sleep(2)


# --- 1. in process ---------------------------------------------------------------------------


def measure_in_process(
    kubeconfig: Path, core: client.CoreV1Api, nodes: list[str], changes: int
) -> dict[str, Any]:
    started = time.monotonic()
    connector = KubernetesConnector(
        KubernetesConnectorConfig(cluster=CLUSTER, kubeconfig=kubeconfig)
    )
    try:
        state = connector.read_state()
        first_s = time.monotonic() - started
        serialize_started = time.monotonic()
        snapshot = TelemetrySnapshot(
            connector_session="bench",
            seq=0,
            sent_at=datetime.now(UTC),
            nodes=state.nodes,
            jobs=state.jobs,
        )
        size = len(snapshot.model_dump_json())
        serialize_s = time.monotonic() - serialize_started
        read_started = time.monotonic()
        connector.read_state()
        read_s = time.monotonic() - read_started
        connector.wait_for_change(0)
        latencies: list[float] = []
        for i in range(changes):
            name = f"change-inproc-{i:04d}"
            external_id = f"{NAMESPACE}/pod/{name}"
            sent = time.monotonic()
            core.create_namespaced_pod(NAMESPACE, pod_body(name, nodes[i % len(nodes)]))
            while True:
                connector.wait_for_change(5.0)
                if any(job.external_id == external_id for job in connector.read_state().jobs):
                    break
                if time.monotonic() - sent > 30:
                    raise SystemExit(f"{external_id} did not reach read_state in 30 s")
            latencies.append(time.monotonic() - sent)
        # The incremental reports against a whole translation of the same caches, after
        # all those changes: the informers stop first, so that both see the same objects
        # (the scheduler still writes conditions into pending pods meanwhile).
        connector.close()
        state = connector.read_state()
        rebuild_started = time.monotonic()
        whole = connector.rebuild_state()
        rebuild_s = time.monotonic() - rebuild_started
        equal = state.nodes == whole.nodes and state.jobs == whole.jobs
        if not equal:
            differ(state, whole)
        return {
            "first_s": first_s,
            "nodes": len(state.nodes),
            "jobs": len(state.jobs),
            "snapshot_mib": size / 2**20,
            "serialize_s": serialize_s,
            "read_s": read_s,
            "rebuild_s": rebuild_s,
            "equal": equal,
            "latencies": latencies,
        }
    finally:
        connector.close()


def differ(state: ClusterState, whole: ClusterState) -> None:
    """Where the incremental reports and the whole translation part (a few of each)."""
    for what, mine, theirs in (
        ("nodes", {n.name: n for n in state.nodes}, {n.name: n for n in whole.nodes}),
        ("jobs", {j.external_id: j for j in state.jobs}, {j.external_id: j for j in whole.jobs}),
    ):
        keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        console.print(f"[red]{what}: {len(keys)} differ[/red]")
        for key in keys[:5]:
            console.print(f"  incremental {mine.get(key)!r}\n  whole       {theirs.get(key)!r}")


# --- 2. the connector process, pushing to the real API --------------------------------------


# --- report ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=40, help="pod changes timed, each way")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument(
        "--skip-push", action="store_true", help="only the in-process figures (no PostgreSQL)"
    )
    parser.add_argument("--dir", type=Path, help="the cluster's folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="shaper-bench-k8s-"))

    with k8s_cluster(directory, args.keep) as kubeconfig:
        api = kube_config.new_client_from_config(config_file=str(kubeconfig))
        # The thread pool's connections, one per worker.
        api.rest_client.pool_manager.connection_pool_kw["maxsize"] = WORKERS
        core = client.CoreV1Api(api)
        try:
            nodes = populate(core, args.nodes, args.gpus_per_node, args.pods)
            wait_running(core, min(args.pods, int(args.nodes * args.gpus_per_node * 0.9)))
            console.print("measuring the connector in process …")
            inproc = measure_in_process(kubeconfig, core, nodes, args.changes)
            console.print(
                f"in process: first read_state {inproc['first_s']:.2f} s, pod change → "
                f"read_state p99 {p99(inproc['latencies']):.2f} s"
            )
            pushed = None
            if not args.skip_push:
                console.print("measuring the connector process pushing to the API …")

                def change(i: int) -> str:
                    name = f"change-pushed-{i:04d}"
                    core.create_namespaced_pod(
                        NAMESPACE, pod_body(name, nodes[-1 - i % len(nodes)])
                    )
                    return f"{NAMESPACE}/pod/{name}"

                pushed = measure_pushed(
                    kind="kubernetes",
                    cluster=CLUSTER,
                    scheduler=SchedulerKind.kubernetes,
                    connector_args=[f"--set=kubeconfig={kubeconfig}"],
                    changes=args.changes,
                    change=change,
                    dsn=args.dsn,
                )
        except ApiException as error:
            raise SystemExit(f"the API server refused: {error.status} {error.reason}") from None
        finally:
            api.close()

    console.print(
        f"cluster: {inproc['nodes']} nodes × {args.gpus_per_node} GPUs, {args.pods} pods "
        f"→ {inproc['jobs']} jobs; snapshot {inproc['snapshot_mib']:.1f} MiB JSON "
        f"(built in {inproc['serialize_s']:.2f} s); a warm read_state {inproc['read_s']:.3f} s "
        f"(incremental; a whole translation, rebuild_state, {inproc['rebuild_s']:.2f} s), "
        f"incremental {'equals' if inproc['equal'] else 'DIFFERS FROM'} the whole translation"
    )
    table = Table(title=f"Kubernetes connector, {args.nodes} nodes, {args.pods} pods")
    for column in ("figure", "measured", "target", ""):
        table.add_column(column, justify="left" if column == "figure" else "right")
    latencies = inproc["latencies"]
    table.add_row(
        "in process: first read_state (informers synced)",
        f"{inproc['first_s']:.2f} s",
        f"≤ {FIRST_SNAPSHOT_TARGET_S:.0f} s",
        verdict(inproc["first_s"], FIRST_SNAPSHOT_TARGET_S),
    )
    table.add_row(
        f"in process: pod change → read_state, p50 / p99 of {len(latencies)}",
        f"{statistics.median(latencies):.2f} / {p99(latencies):.2f} s",
        f"p99 ≤ {CHANGE_P99_TARGET_S:.0f} s",
        verdict(p99(latencies), CHANGE_P99_TARGET_S),
    )
    if pushed is not None:
        latencies = pushed["latencies"]
        table.add_row(
            f"process: start → first snapshot stored ({pushed['jobs']} jobs)",
            f"{pushed['first_s']:.2f} s",
            f"≤ {FIRST_SNAPSHOT_TARGET_S:.0f} s",
            verdict(pushed["first_s"], FIRST_SNAPSHOT_TARGET_S),
        )
        table.add_row(
            f"process: pod change → control plane, p50 / p99 of {len(latencies)}",
            f"{statistics.median(latencies):.2f} / {p99(latencies):.2f} s",
            f"p99 ≤ {CHANGE_P99_TARGET_S:.0f} s",
            verdict(p99(latencies), CHANGE_P99_TARGET_S),
        )
        table.add_row(
            "process: memory, RSS at the end / peak (VmHWM)",
            f"{pushed['rss']:.0f} / {pushed['hwm']:.0f} MiB",
            f"≤ {MEMORY_TARGET_MIB:.0f} MiB",
            verdict(pushed["hwm"], MEMORY_TARGET_MIB),
        )
    console.print(table)
    for what, values in (("in process", inproc["latencies"]), ("pushed", latencies)):
        console.print(f"{what}, latencies in order (s): " + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
