"""The REAL node the ``test_real_node_*`` modules share (issue 15), and what a module leaves
on it.

``scripts/k8s/real-node/real-node.sh`` joins a real kubelet (containerd 2.3, runc, CRIU)
to a control plane of its own (``scripts/k8s-cluster.sh``: Kueue's manager too). Starting
it takes 20-25 s, so ``tests/k8s/conftest.py`` starts it once for the package and stops it
after the last of those modules; each module gets it through a module-scoped fixture that
notes what is on the node when the module begins (:func:`inventory`) and, when it ends,
removes whatever the module added (:func:`remove_added`): webhook configurations, RBAC,
namespaces, Kueue objects, Jobs and pods, checkpoint images in containerd and the kubelet's
checkpoint archives. So a module sees the node as it would have found a fresh one, run
alone or after the others, in any order.

Runs only where the real node's binaries are already in the cache (``real-node.sh start``
builds them once: kubelet ~6 min, containerd ~4 min on 2 cores) and as root with CRIU. The
control plane and the kubelet are local processes; the kubelet's ports come from
``SHAPER_K8S_PORT_BASE`` + 100 so that they do not meet the session cluster of the other
tests here. One real node per machine (the kubelet's device plugin socket is at a fixed
path).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from tests.k8s.conftest import KUEUE_GROUP, KUEUE_VERSION, wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s" / "real-node" / "real-node.sh"
NODE = "shaper-real-1"
PORT_BASE = int(os.environ.get("SHAPER_K8S_PORT_BASE", "24400")) + 100


class RealNodeUnavailable(Exception):
    """The real node cannot run here, or did not start; the message says why."""


def why_not_runnable() -> str | None:
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

    @property
    def checkpoint_archives(self) -> Path:
        """Where the kubelet writes its checkpoint archives."""
        return self.directory / "kubelet" / "root" / "checkpoints"

    def ctr(self, *args: str) -> str:
        """The node's ``ctr`` on its containerd, in the CRI's namespace."""
        (socket,) = self.directory.glob("containerd-*/containerd.sock")
        done = subprocess.run(
            [str(Path(self.script("built")) / "ctr"), "--address", str(socket), "-n", "k8s.io"]
            + list(args),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout


@contextmanager
def started() -> Iterator[RealNode]:
    """A real node of its own folder under /tmp, stopped and removed after."""
    why_not = why_not_runnable()
    if why_not is not None:
        # Not a skip: `make test` installs CRIU and runc and builds the node
        # (real-node.sh build), so on the machines the suite runs on a missing piece is a
        # broken install, to be seen, not passed over.
        raise RealNodeUnavailable(
            f"{why_not}; `make test` installs and builds it (real-node.sh build)"
        )
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

    done = subprocess.run(
        [str(SCRIPT), "start"], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    if done.returncode != 0:
        stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise RealNodeUnavailable(
            f"the real node did not start (real-node.sh start):\n{done.stderr}"
        )
    api = kube_config.new_client_from_config(config_file=str(directory / "cluster" / "kubeconfig"))
    try:
        yield RealNode(directory, env, client.CoreV1Api(api))
    finally:
        api.close()
        stop()
        shutil.rmtree(directory, ignore_errors=True)


# --- what a module leaves on the node ---------------------------------------------------------

Key = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True)
class Kind:
    """One kind of object a module may leave, listed and deleted through the node's API."""

    name: str
    listed: Callable[[client.ApiClient], list[Key]]
    delete: Callable[[client.ApiClient, Key], Any]
    exists: Callable[[client.ApiClient, Key], Any]


def _keys(items: Any) -> list[Key]:
    return [(i.metadata.namespace or "", i.metadata.name) for i in items.items]


def _kueue_keys(listed: dict[str, Any]) -> list[Key]:
    return [(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in listed["items"]]


def _kueue(plural: str) -> Kind:
    def call(api: client.ApiClient, verb: str, key: Key) -> Any:
        """``verb`` (get, delete) the object: ``<verb>_namespaced_custom_object`` for one
        in a namespace, ``<verb>_cluster_custom_object`` for a cluster-scoped one."""
        namespace, name = key
        custom = client.CustomObjectsApi(api)
        if namespace:
            method = getattr(custom, f"{verb}_namespaced_custom_object")
            return method(KUEUE_GROUP, KUEUE_VERSION, namespace, plural, name)
        method = getattr(custom, f"{verb}_cluster_custom_object")
        return method(KUEUE_GROUP, KUEUE_VERSION, plural, name)

    return Kind(
        plural,
        # every namespace's, for a namespaced kind
        lambda api: _kueue_keys(
            client.CustomObjectsApi(api).list_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, plural
            )
        ),
        lambda api, key: call(api, "delete", key),
        lambda api, key: call(api, "get", key),
    )


def _cluster_scoped(name: str, api_class: Any, kind: str) -> Kind:
    """A kind the client's ``api_class`` lists, deletes and reads as ``list_<kind>`` …"""
    return Kind(
        name,
        lambda api: _keys(getattr(api_class(api), f"list_{kind}")()),
        lambda api, key: getattr(api_class(api), f"delete_{kind}")(key[1]),
        lambda api, key: getattr(api_class(api), f"read_{kind}")(key[1]),
    )


def _namespaced(name: str, api_class: Any, kind: str, **deleting: Any) -> Kind:
    """… and one it has in every namespace as ``list_<kind>_for_all_namespaces``."""
    return Kind(
        name,
        lambda api: _keys(getattr(api_class(api), f"list_{kind}_for_all_namespaces")()),
        lambda api, key: getattr(api_class(api), f"delete_namespaced_{kind}")(
            key[1], key[0], **deleting
        ),
        lambda api, key: getattr(api_class(api), f"read_namespaced_{kind}")(key[1], key[0]),
    )


# In the order they are removed: the webhooks first (nothing is admitted through a webhook
# whose server has gone), then what owns pods, the pods, Kueue's objects from the Workloads
# up (a ClusterQueue waits for its Workloads, a ResourceFlavor for its ClusterQueues), the
# RBAC and the namespaces.
KINDS = (
    _cluster_scoped(
        "mutatingwebhookconfigurations",
        client.AdmissionregistrationV1Api,
        "mutating_webhook_configuration",
    ),
    _cluster_scoped(
        "validatingwebhookconfigurations",
        client.AdmissionregistrationV1Api,
        "validating_webhook_configuration",
    ),
    _namespaced("jobs", client.BatchV1Api, "job", propagation_policy="Background"),
    _namespaced("pods", client.CoreV1Api, "pod", grace_period_seconds=1),
    _kueue("workloads"),
    _kueue("localqueues"),
    _kueue("clusterqueues"),
    _kueue("resourceflavors"),
    _cluster_scoped("clusterrolebindings", client.RbacAuthorizationV1Api, "cluster_role_binding"),
    _cluster_scoped("clusterroles", client.RbacAuthorizationV1Api, "cluster_role"),
    _cluster_scoped("namespaces", client.CoreV1Api, "namespace"),
)


@dataclass(frozen=True)
class Inventory:
    """What is on the node: objects by kind, containerd's images by name, the kubelet's
    checkpoint archives."""

    objects: dict[str, set[Key]]
    images: set[str]
    archives: set[Path]


def _images(node: RealNode) -> set[str]:
    # by name; the CRI also lists each image by its id (sha256:…)
    return {n for n in node.ctr("images", "ls", "-q").split() if not n.startswith("sha256:")}


def inventory(node: RealNode) -> Inventory:
    api = node.core.api_client
    return Inventory(
        objects={kind.name: set(kind.listed(api)) for kind in KINDS},
        images=_images(node),
        archives=set(node.checkpoint_archives.glob("*")),
    )


def _gone(api: client.ApiClient, kind: Kind, key: Key) -> bool:
    try:
        kind.exists(api, key)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def remove_added(node: RealNode, before: Inventory) -> None:
    """Remove what was added to the node since ``before``, each kind once the one before it
    has gone; fail, naming it, if something does not go."""
    api = node.core.api_client
    for kind in KINDS:
        added = sorted(set(kind.listed(api)) - before.objects[kind.name])
        for key in added:
            try:
                kind.delete(api, key)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for key in added:
            wait_for(
                f"{kind.name} {'/'.join(key)} deleted", functools.partial(_gone, api, kind, key)
            )
    # The checkpoint images the module imported, now that no pod runs from them.
    for image in sorted(_images(node) - before.images):
        node.ctr("images", "rm", image)
    for archive in set(node.checkpoint_archives.glob("*")) - before.archives:
        archive.unlink()
