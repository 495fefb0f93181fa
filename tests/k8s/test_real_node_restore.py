"""A pod's container checkpointed on a REAL node and restored into a new pod (issue 15).

``scripts/k8s/real-node/real-node.sh`` joins a real kubelet (containerd 2.3, runc, CRIU)
to a control plane of its own (tests/k8s/real_node.py; one node for the package, started by
``tests/k8s/conftest.py``); a busybox counter pod runs there as a real process. The
kubelet's checkpoint API archives its container, the pod is deleted, the archive becomes a
checkpoint image (one layer, ``org.criu.checkpoint.container.name``) imported into
containerd, and a new pod whose container image is that checkpoint image must go on
counting from where the first one was: restored by containerd's CRI, not started anew.

Runs only where the real node's binaries are already in the cache and as root with CRIU;
otherwise it fails, saying which (tests/k8s/real_node.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.k8s.conftest import wait_for
from tests.k8s.real_node import NODE, RealNode

BUSYBOX = "docker.io/shaper/busybox:local"
CHECKPOINT_IMAGE = "localhost/shaper/counter-checkpoint:test"
COUNTER = "i=0; while true; do i=$((i+1)); echo $i; sleep 1; done"

pytestmark = pytest.mark.slow


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
