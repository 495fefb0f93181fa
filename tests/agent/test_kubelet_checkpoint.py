"""The node agent's kubelet checkpoints, without a kubelet: the checkpoint image it writes,
and its HTTP API's refusals as the connector's callback sees them.

A real kubelet and containerd take the checkpoint in
tests/k8s/test_real_node_checkpoint_preemption.py (the whole path, and the refusals that
need them: a pod not on the node, containerd missing, the kubelet refusing).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.api import make_server, serve_in_thread
from agent.kubelet import CheckpointFailed, KubeletAccess, KubeletCheckpointer, _Pod
from agent.oci_image import (
    CHECKPOINT_CONTAINER_ANNOTATION,
    checkpointed_container,
    write_checkpoint_image,
)
from agent.settings import AgentSettings
from connectors.base import ConnectorError
from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.node_agent import agent_checkpoint
from tests.connectors.test_restore_webhook import tls_files
from wire.checkpoint_image import KUBELET_CHECKPOINT_PATH

REPO = Path(__file__).resolve().parents[2]
TOKEN = "agent-api-token-for-tests"
NODE = "node-a"


def kubelet_archive(path: Path, container: str = "counter") -> Path:
    """A tar laid out as the kubelet's checkpoint archive is (config.dump names the
    container; checkpoint/ would hold CRIU's images)."""
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("config.dump", json.dumps({"id": "abc", "name": container}).encode()),
            ("checkpoint/pages-1.img", os.urandom(4096)),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_checkpoint_image_is_the_archive_unchanged_naming_its_container(
    tmp_path: Path,
) -> None:
    archive = kubelet_archive(tmp_path / "checkpoint.tar")
    assert checkpointed_container(archive) == "counter"
    name = "localhost/shaper/checkpoint/default/job-x/counter:ckpt-1"
    out = tmp_path / "image.tar"
    write_checkpoint_image(out, name, archive=archive, container="counter")

    with tarfile.open(out) as image:

        def blob(digest: str) -> bytes:
            member = image.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            data = member.read()
            assert f"sha256:{hashlib.sha256(data).hexdigest()}" == digest
            return data

        layout = image.extractfile("oci-layout")
        assert layout is not None and json.load(layout) == {"imageLayoutVersion": "1.0.0"}
        index_file = image.extractfile("index.json")
        assert index_file is not None
        (entry,) = json.load(index_file)["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == name
        manifest = json.loads(blob(entry["digest"]))
        assert manifest["annotations"] == {CHECKPOINT_CONTAINER_ANNOTATION: "counter"}
        (layer,) = manifest["layers"]
        assert blob(layer["digest"]) == archive.read_bytes()
        config = json.loads(blob(manifest["config"]["digest"]))
        assert config["rootfs"]["diff_ids"] == [layer["digest"]]

    # The real node's script writes the same image through the agent's module.
    again = tmp_path / "again.tar"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/k8s/real-node/mkimage.py"),
            "--checkpoint",
            str(again),
            name,
            str(archive),
            "counter",
        ],
        check=True,
        timeout=60,
    )
    assert again.read_bytes() == out.read_bytes()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkpointer_without_kubelet(tmp_path: Path) -> KubeletCheckpointer:
    return KubeletCheckpointer(
        node=NODE,
        kubelet=KubeletAccess(url=f"https://127.0.0.1:{_closed_port()}", insecure=True),
        ctr="ctr",
        containerd_address=str(tmp_path / "containerd.sock"),
        repository="localhost/shaper/checkpoint",
        work_dir=tmp_path / "work",
    )


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    """The agent's API, served for NODE, its kubelet a port where nothing listens."""
    checkpointer = checkpointer_without_kubelet(tmp_path)
    server = make_server("127.0.0.1", 0, checkpointer=checkpointer, token=TOKEN)
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        checkpointer.close()


def pod(node: str = NODE) -> PodOnNode:
    return PodOnNode(namespace="default", pod="job-x-abcde", node=node, uid="u-1")


def test_the_api_refuses_a_caller_without_the_token_and_a_bad_request_naming_the_field(
    agent_url: str,
) -> None:
    url = agent_url + KUBELET_CHECKPOINT_PATH
    body = {"namespace": "default", "pod": "job-x-abcde"}
    assert httpx.get(agent_url + "/healthz").json() == {"ok": True, "node": NODE}
    for headers, says in (
        ({}, "a Bearer token is required"),
        ({"Authorization": "Bearer not-the-token"}, "the token is not this agent's"),
    ):
        answer = httpx.post(url, json=body, headers=headers)
        assert answer.status_code == 401 and says in answer.json()["error"]

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for bad, field in (
        ({"namespace": "Not_A_Namespace", "pod": "p"}, "namespace"),
        ({"namespace": "default"}, "pod"),
        ({**body, "containers": []}, "containers"),
        ({**body, "image": "x"}, "image"),
    ):
        answer = httpx.post(url, json=bad, headers=bearer)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"].startswith(f"{field}"), answer.json()

    # The connector's callback: a refused token is not worth a retry.
    wrong = agent_checkpoint(agent_url=lambda node: agent_url, token="not-the-token")
    with pytest.raises(ConnectorError, match="HTTP 401: Authorization") as refused:
        wrong([pod()])
    assert not refused.value.retryable


def test_a_kubelet_that_does_not_answer_is_a_retryable_error_naming_it(agent_url: str) -> None:
    checkpoint = agent_checkpoint(agent_url=lambda node: agent_url, token=TOKEN)
    with pytest.raises(ConnectorError) as failed:
        checkpoint([pod()])
    assert failed.value.retryable
    assert "HTTP 502" in str(failed.value) and "the kubelet at https://127.0.0.1:" in str(
        failed.value
    )
    assert "did not answer" in str(failed.value)


def test_the_callback_refuses_work_on_several_pods_or_an_agent_that_does_not_answer(
    agent_url: str,
) -> None:
    asked: list[str] = []

    def url_of(node: str) -> str:
        asked.append(node)
        return agent_url

    checkpoint = agent_checkpoint(agent_url=url_of, token=TOKEN)
    with pytest.raises(ConnectorError, match="one pod on one node") as refused:
        checkpoint([pod(), pod("node-b")])
    assert not refused.value.retryable and asked == []

    gone = agent_checkpoint(
        agent_url=lambda node: f"http://127.0.0.1:{_closed_port()}", token=TOKEN, timeout_s=5
    )
    with pytest.raises(ConnectorError, match="did not answer") as unanswered:
        gone([pod()])
    assert unanswered.value.retryable


def test_the_api_over_tls_is_reached_with_its_ca(tmp_path: Path) -> None:
    cert, key, ca = tls_files(tmp_path)
    (tmp_path / "ca.crt").write_bytes(ca)
    checkpointer = checkpointer_without_kubelet(tmp_path)
    server = make_server(
        "127.0.0.1", 0, checkpointer=checkpointer, token=TOKEN, tls_cert=cert, tls_key=key
    )
    serve_in_thread(server)
    url = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ConnectorError, match="did not answer") as untrusted:
            agent_checkpoint(agent_url=lambda node: url, token=TOKEN)([pod()])
        assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value)
        trusted = agent_checkpoint(agent_url=lambda node: url, token=TOKEN, ca=tmp_path / "ca.crt")
        with pytest.raises(ConnectorError, match="HTTP 502: .*the kubelet at"):
            trusted([pod()])
    finally:
        server.shutdown()
        server.server_close()
        checkpointer.close()


def test_the_settings_refuse_half_a_client_certificate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SHAPER_KUBELET_CLIENT_CERT", str(tmp_path / "c.crt"))
    with pytest.raises(ValueError, match="SHAPER_KUBELET_CLIENT_KEY go together"):
        AgentSettings()
    monkeypatch.setenv("SHAPER_KUBELET_CLIENT_KEY", str(tmp_path / "c.key"))
    monkeypatch.setenv("SHAPER_KUBELET_INSECURE", "true")
    monkeypatch.setenv("SHAPER_KUBELET_CA", str(tmp_path / "ca.crt"))
    with pytest.raises(ValueError, match="set one, not both"):
        AgentSettings()


def test_the_api_command_needs_its_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAPER_")}
    done = subprocess.run(
        [sys.executable, "-m", "agent", "api", "--node", NODE, "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "SHAPER_AGENT_API_TOKEN" in done.stderr


@pytest.mark.parametrize(
    "named",
    [
        "/etc/shadow",
        "{tmp}/checkpoints/../secret.tar",
        "{tmp}/elsewhere/checkpoint-p_ns-c-1.tar",
        "{tmp}/checkpoints/checkpoint-link.tar",
        "checkpoints/checkpoint-p_ns-c-1.tar",
    ],
)
def test_an_archive_the_kubelet_names_outside_its_checkpoints_folder_is_not_touched(
    tmp_path: Path, named: str
) -> None:
    """The agent runs as root and removes the archive after the import: a path the kubelet's
    answer names that is not a checkpoint archive of a checkpoints folder (a file elsewhere,
    a ``..``, a link, a relative path) is refused, and the file stays."""
    (tmp_path / "checkpoints").mkdir()
    victim = tmp_path / "secret.tar"
    victim.write_text("not the agent's")
    (tmp_path / "checkpoints" / "checkpoint-link.tar").symlink_to(victim)
    path = named.format(tmp=tmp_path)

    def kubelet(request: httpx.Request) -> httpx.Response:
        assert request.url.path.startswith("/checkpoint/ns/p/c")
        return httpx.Response(200, json={"items": [path]})

    checkpointer = KubeletCheckpointer(
        node="n1",
        kubelet=KubeletAccess(url="https://127.0.0.1:10250", insecure=True),
        ctr="ctr",
        containerd_address="/nonexistent.sock",
        repository="localhost/shaper/checkpoint",
        work_dir=tmp_path / "work",
        transport=httpx.MockTransport(kubelet),
    )
    pod = _Pod(namespace="ns", name="p", uid="u", phase="Running", containers=("c",))
    with pytest.raises(CheckpointFailed) as refused:
        checkpointer._kubelet_checkpoint(pod, "c", what="pod ns/p")
    assert refused.value.status == 502
    assert "not a checkpoint archive of its checkpoints folder" in str(refused.value)
    assert victim.read_text() == "not the agent's"
