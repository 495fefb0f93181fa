"""The node agent's checkpoint images are garbage-collected on a REAL node (issue 15), and
the agent's kubelet identity of deploy/kubernetes/components/node-agent works there.

The real node of ``tests/k8s/real_node.py`` (a kubelet v1.37 with containerd 2.3 and CRIU).
The component's Namespace, ServiceAccount, ClusterRole and binding are applied to its API
server as they are; the agent (a real ``python -m agent api`` process, as the DaemonSet
runs it) calls the kubelet with a token of that ServiceAccount (TokenRequest, as the
DaemonSet's projected volume holds it), so the kubelet's own authentication (TokenReview)
and fine-grained authorization decide. Then ``python -m agent gc-checkpoints`` (and the
API's own periodic sweep) must:

* keep an image that no restored pod used yet, within its TTL;
* keep the image a restored pod runs from, even past its TTL, and, once the pod and its
  containers are gone, keep it still within its TTL (the Job still names it: Kueue may
  evict and re-admit the Workload on its own) and remove it past the TTL;
* remove an unused image past its TTL;
* never touch an image the agent did not import: one outside its repository, or under it
  with a tag the agent does not write, however old.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client, utils

from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.node_agent import agent_checkpoint
from connectors.kubernetes.restore_webhook import image_restore
from tests.k8s.conftest import wait_for
from tests.k8s.real_node import NODE, PORT_BASE, REPO, RealNode
from tests.k8s.test_real_node_checkpoint_preemption import (
    AGENT_TOKEN,
    NAMESPACE,
    agent_env,
    start_agent,
    stop_agent,
)
from tests.k8s.test_real_node_restore import BUSYBOX, counter_pod, gone, running, state

pytestmark = pytest.mark.slow

AGENT_PORT = PORT_BASE + 96  # +90..+95: the kubelet, the webhook, the other module's agents
SWEEPING_PORT = PORT_BASE + 97
COMPONENT = REPO / "deploy/kubernetes/components/node-agent"
IDENTITY = ("namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml", "clusterrolebinding.yaml")
REPOSITORY = "localhost/shaper/checkpoint"  # the agent's default


@dataclass(frozen=True)
class Agent:
    url: str
    env: dict[str, str]
    log: Path

    def checkpoint(self, pod: client.V1Pod) -> str:
        """The checkpoint image of the pod's counter, through the agent's API."""
        call = agent_checkpoint(agent_url=lambda _node: self.url, token=AGENT_TOKEN)
        on_node = PodOnNode(NAMESPACE, pod.metadata.name, pod.spec.node_name, pod.metadata.uid)
        restore = image_restore(call([on_node]))
        assert restore is not None
        return restore.images["counter"]

    def ctr(self, *args: str) -> str:
        done = subprocess.run(
            [self.env["SHAPER_CTR"], "--address", self.env["SHAPER_CONTAINERD_ADDRESS"]]
            + ["-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    def images(self) -> set[str]:
        return {n for n in self.ctr("images", "ls", "-q").split() if not n.startswith("sha256:")}

    def gc(self, **settings: str) -> dict[str, tuple[str, str]]:
        """``python -m agent gc-checkpoints`` once: image → (removed|kept, why)."""
        done = subprocess.run(
            [sys.executable, "-m", "agent", "gc-checkpoints", "--node", NODE],
            env={**self.env, **settings},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        said: dict[str, tuple[str, str]] = {}
        for line in done.stdout.splitlines():
            what, name, why = line.split("\t")
            said[name] = (what, why)
        return said


@pytest.fixture(scope="module")
def agent(real_node: RealNode) -> Iterator[Agent]:
    """The agent under the component's ServiceAccount: its token, no client certificate."""
    api = real_node.core.api_client
    for name in IDENTITY:
        utils.create_from_dict(api, yaml.safe_load((COMPONENT / name).read_text()))
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        "shaper-node-agent",
        "shaper-node",
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[])),
    )
    token_file = real_node.directory / "agent-sa" / "token"
    token_file.parent.mkdir()
    token_file.write_text(token.status.token)
    token_file.chmod(0o600)
    env = agent_env(real_node, real_node.directory / "agent-sa" / "state")
    del env["SHAPER_KUBELET_CLIENT_CERT"], env["SHAPER_KUBELET_CLIENT_KEY"]
    env["SHAPER_KUBELET_TOKEN_FILE"] = str(token_file)
    env["SHAPER_CHECKPOINT_IMAGE_GC_INTERVAL_S"] = "0"  # sweeps by the command only, here
    log = real_node.directory / "logs" / "agent-sa.log"
    process = start_agent(env, AGENT_PORT, log)
    try:
        yield Agent(f"http://127.0.0.1:{AGENT_PORT}", env, log)
    finally:
        stop_agent(process)


def counting(node: RealNode, name: str, image: str = BUSYBOX) -> client.V1Pod:
    node.core.create_namespaced_pod(NAMESPACE, counter_pod(name, image))
    pod = wait_for(
        lambda: f"{name} running: " + state(node, name), lambda: running(node, name), timeout=120
    )
    wait_for(f"{name} at 3", lambda: len(node.counts(name)) >= 3)
    return pod


def deleted(node: RealNode, name: str) -> None:
    node.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=1)
    wait_for(f"{name} deleted", lambda: gone(node, name))


def test_an_image_is_kept_while_its_restored_pod_uses_it_and_until_its_ttl_after(
    real_node: RealNode,
    agent: Agent,
) -> None:
    node = real_node
    first = counting(node, "gc-first")
    # The agent's kubelet calls under the component's ServiceAccount went through.
    image = agent.checkpoint(first)
    at = node.counts("gc-first")[-1]
    assert image.startswith(f"{REPOSITORY}/{NAMESPACE}/gc-first/counter:ckpt-")
    assert image in agent.images()
    deleted(node, "gc-first")

    # Not restored yet, within its TTL: kept.
    assert agent.gc()[image][0] == "kept"
    restored = counting(node, "gc-restored", image)
    # The same process, counting on from the checkpoint (its log begins with the old one's).
    wait_for("the restored counter on", lambda: node.counts("gc-restored")[-1] > at + 1)
    counted = node.counts("gc-restored")
    assert counted == list(range(1, len(counted) + 1)), counted
    assert restored.spec.containers[0].image == image
    # In use: kept, past its TTL too.
    assert agent.gc()[image] == ("kept", "in use")
    assert agent.gc(SHAPER_CHECKPOINT_IMAGE_TTL_S="1")[image] == ("kept", "in use")
    assert image in agent.images()

    deleted(node, "gc-restored")
    # Its containers go with the kubelet's next container GC: until then, still in use;
    # then unused, and kept within its TTL (the Job's pointer still names it).
    said = wait_for(
        lambda: f"{image} unused; images: {agent.images()}",
        lambda: (s := agent.gc()).get(image, ("", ""))[1].startswith("unused") and s,
        timeout=180,
    )
    assert said[image][0] == "kept"
    assert image in agent.images()
    # Past its TTL, unused: removed.
    assert agent.gc(SHAPER_CHECKPOINT_IMAGE_TTL_S="1")[image] == ("removed", "ttl")
    assert image not in agent.images()
    assert agent.gc().get(image) is None


def test_an_unused_image_past_its_ttl_is_removed_and_others_images_are_never_touched(
    real_node: RealNode,
    agent: Agent,
) -> None:
    node = real_node
    pod = counting(node, "gc-ttl")
    image = agent.checkpoint(pod)
    # Images the agent did not import, however old: another repository, and its own
    # repository with a tag it does not write; the busybox image the pods run.
    foreign = [
        "localhost/not-shaper/default/gc-ttl/counter:ckpt-20200101T000000000Z",
        f"{REPOSITORY}/default/gc-ttl/counter:latest",
        f"{REPOSITORY}-other/default/gc-ttl/counter:ckpt-20200101T000000000Z",
    ]
    for name in foreign:
        agent.ctr("images", "tag", image, name)
    try:
        # Within its TTL, unused (the pod it came from runs its own image): kept.
        assert agent.gc()[image][0] == "kept"
        said = agent.gc(SHAPER_CHECKPOINT_IMAGE_TTL_S="0.001")
        assert said[image] == ("removed", "ttl")
        assert not set(foreign) & set(said) and BUSYBOX not in said
        images = agent.images()
        assert image not in images and set(foreign) | {BUSYBOX} <= images
        # A TTL of 0 removes nothing: the foreign ones are still not the agent's.
        assert agent.gc(SHAPER_CHECKPOINT_IMAGE_TTL_S="0") == {}
    finally:
        for name in foreign:
            agent.ctr("images", "rm", name)
    # The counter it was taken from never noticed.
    assert node.counts("gc-ttl") == list(range(1, len(node.counts("gc-ttl")) + 1))
    deleted(node, "gc-ttl")


def test_the_apis_periodic_sweep_removes_an_expired_image_and_says_so(
    real_node: RealNode,
    agent: Agent,
) -> None:
    node = real_node
    pod = counting(node, "gc-sweep")
    image = agent.checkpoint(pod)
    log = node.directory / "logs" / "agent-sweeping.log"
    sweeping = start_agent(
        {
            **agent.env,
            "SHAPER_CHECKPOINT_IMAGE_GC_INTERVAL_S": "1",
            "SHAPER_CHECKPOINT_IMAGE_TTL_S": "1",
        },
        SWEEPING_PORT,
        log,
    )
    try:
        wait_for(
            lambda: f"the sweep to remove {image}: {log.read_text()[-2000:]}",
            lambda: image not in agent.images(),
        )
        wait_for(
            "the removal logged",
            lambda: f"removed checkpoint image {image} (TTL passed, unused)" in log.read_text(),
        )
        assert BUSYBOX in agent.images()
    finally:
        stop_agent(sweeping)
    deleted(node, "gc-sweep")
