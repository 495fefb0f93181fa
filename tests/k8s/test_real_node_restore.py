"""A pod's container checkpointed on a REAL node and restored into a new pod (issue 15).

``scripts/k8s/real-node/real-node.sh`` joins a real kubelet (containerd 2.3, runc, CRIU)
to a control plane of its own; a busybox counter pod runs there as a real process. The
kubelet's checkpoint API archives its container, the pod is deleted, the archive becomes a
checkpoint image (one layer, ``org.criu.checkpoint.container.name``) imported into
containerd, and a new pod whose container image is that checkpoint image must go on
counting from where the first one was: restored by containerd's CRI, not started anew.

Runs only where the real node's binaries are already in the cache (``real-node.sh start``
builds them once: kubelet ~6 min, containerd ~4 min on 2 cores) and as root with CRIU;
otherwise it is skipped, saying which. The control plane and the kubelet are local
processes; the kubelet's ports come from ``SHAPER_K8S_PORT_BASE`` + 100 so that they do not
meet the session cluster of the other tests here. One real node per machine (the
kubelet's device plugin socket is at a fixed path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from tests.k8s.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s" / "real-node" / "real-node.sh"
NODE = "shaper-real-1"
BUSYBOX = "docker.io/shaper/busybox:local"
CHECKPOINT_IMAGE = "localhost/shaper/counter-checkpoint:test"
COUNTER = "i=0; while true; do i=$((i+1)); echo $i; sleep 1; done"
PORT_BASE = int(os.environ.get("SHAPER_K8S_PORT_BASE", "24400")) + 100


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "the real node needs root (kubelet, containerd, runc, CRIU)"
    if shutil.which("criu") is None or shutil.which("runc") is None:
        return "criu or runc is not installed (scripts/install-criu.sh; apt-get install runc)"
    built = subprocess.run(
        [str(SCRIPT), "built"],
        capture_output=True,
        text=True,
        env={**os.environ, "GPU_MODE": "status"},
        check=False,
    )
    if built.returncode != 0:
        # e.g. "not built in <cache>/bin: kubelet containerd (real-node.sh start builds them)"
        return "the real node: " + built.stderr.strip().removeprefix("real-node: ERROR: ")
    return None


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _runnable() -> None:
    """Not a skip: ``make test`` installs CRIU and runc and builds the node
    (``real-node.sh build``), so on the machines the suite runs on a missing piece is a
    broken install, to be seen, not passed over."""
    why_not = _why_not_runnable()
    if why_not is not None:
        pytest.fail(f"{why_not}; `make test` installs and builds it (real-node.sh build)")


@dataclass
class RealNode:
    directory: Path
    env: dict[str, str]
    core: client.CoreV1Api

    def script(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            [str(SCRIPT), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"real-node.sh {' '.join(args)}:\n{done.stderr}{done.stdout}"
        return done.stdout.strip()

    def counts(self, pod: str, since: str = "") -> list[int]:
        """What the pod's counter printed (from the second ``since`` on, UTC), from the
        kubelet's log of its container (``kubectl logs`` would need the API server to
        reach the kubelet)."""
        uid = self.core.read_namespaced_pod(pod, "default").metadata.uid
        folder = self.directory / "pod-logs" / f"default_{pod}_{uid}" / "counter"
        logs = sorted(folder.glob("*.log"))
        if not logs:
            return []
        # CRI log lines, "<RFC 3339 time> stdout F <text>"; whole ones only (the kubelet
        # may be writing the last)
        lines = [line.split() for line in logs[-1].read_text().split("\n")[:-1] if line.strip()]
        return [int(words[3]) for words in lines if words[0][:19] >= since]


@pytest.fixture(scope="module")
def real_node() -> Iterator[RealNode]:
    directory = Path(tempfile.mkdtemp(prefix="shaper-real-node-", dir="/tmp"))
    env = {
        **os.environ,
        "EXP": str(directory),
        "SHAPER_K8S_PORT_BASE": str(PORT_BASE),
        "GPU_MODE": "status",  # nvidia.com/gpu on the Node's status; no device plugin needed
    }

    def stop() -> None:
        subprocess.run(
            [str(SCRIPT), "stop"], capture_output=True, env=env, timeout=300, check=False
        )

    started = subprocess.run(
        [str(SCRIPT), "start"], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    if started.returncode != 0:
        stop()
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(
            f"the real node did not start (real-node.sh start):\n{started.stderr}", pytrace=False
        )
    api = kube_config.new_client_from_config(config_file=str(directory / "cluster" / "kubeconfig"))
    try:
        yield RealNode(directory, env, client.CoreV1Api(api))
    finally:
        api.close()
        stop()
        shutil.rmtree(directory, ignore_errors=True)


def counter_pod(name: str, image: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(
            host_network=True,
            node_selector={"shaper.io/real-node": "true"},
            termination_grace_period_seconds=2,
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="counter",
                    image=image,
                    image_pull_policy="Never",
                    command=["sh", "-c", COUNTER],
                )
            ],
        ),
    )


def running(node: RealNode, name: str) -> client.V1Pod | None:
    pod = node.core.read_namespaced_pod(name, "default")
    statuses = pod.status.container_statuses or []
    if statuses and statuses[0].state.terminated:  # restartPolicy Never: it stays so
        raise AssertionError(state(node, name))
    return pod if statuses and statuses[0].state.running else None


def state(node: RealNode, name: str) -> str:
    """The pod's phase and its container's state, for a failure's message."""
    pod = node.core.read_namespaced_pod(name, "default")
    statuses = pod.status.container_statuses or []
    return f"pod {name} {pod.status.phase}: " + (
        str(statuses[0].state) if statuses else "no container status"
    )


def gone(node: RealNode, name: str) -> bool:
    try:
        node.core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def test_a_checkpointed_counter_counts_on_in_a_new_pod(real_node: RealNode) -> None:
    node = real_node
    node.core.create_namespaced_pod("default", counter_pod("counter", BUSYBOX))
    pod = wait_for("the counter pod running", lambda: running(node, "counter"))
    assert pod.spec.node_name == NODE
    wait_for("the counter at 3", lambda: len(node.counts("counter")) >= 3)

    before = node.counts("counter")[-1]
    archive = Path(node.script("checkpoint", "default", "counter", "counter"))
    after = node.counts("counter")[-1]
    assert archive.is_file()
    # the checkpoint leaves the container running; the pod is then deleted
    node.core.delete_namespaced_pod("counter", "default", grace_period_seconds=1)
    wait_for("the counter pod deleted", lambda: gone(node, "counter"))

    node.script("image", str(archive), CHECKPOINT_IMAGE)
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    # The same command as the first pod's: were the image not restored, it would count from 1.
    node.core.create_namespaced_pod("default", counter_pod("counter-restored", CHECKPOINT_IMAGE))
    restored = wait_for(
        lambda: "the restored pod running; " + state(node, "counter-restored"),
        lambda: running(node, "counter-restored"),
        timeout=120,
    )
    assert restored.spec.node_name == NODE
    assert restored.status.container_statuses[0].restart_count == 0
    new = wait_for(
        "the restored counter printing",
        lambda: (
            len(node.counts("counter-restored", since)) >= 2
            and node.counts("counter-restored", since)
        ),
    )

    # It counts on from where the checkpoint caught it (somewhere in before..after), not
    # from 1: the same process, restored.
    assert before < new[0] <= after + 1, (before, after, new)
    # The new pod's log begins with the old one's up to the checkpoint (containerd restores
    # the container's log from the archive), then goes on without a gap or a restart.
    whole = node.counts("counter-restored")
    assert whole == list(range(1, len(whole) + 1)), whole
    # and keeps counting
    wait_for(
        "the restored counter going on", lambda: node.counts("counter-restored")[-1] > whole[-1]
    )
