"""connectors.kubernetes.restore_webhook without a cluster: the patch it answers for a pod,
its refusals, and its HTTP answers to requests that are not AdmissionReviews (the real API
server's calls: tests/k8s/test_real_node_checkpoint_preemption.py)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from connectors.kubernetes.pods import RESUME_FROM
from connectors.kubernetes.restore_webhook import (
    PATH,
    RESTORE_BY_IMAGE,
    RESTORE_LABEL,
    ImageRestore,
    Refused,
    image_restore,
    mutation,
    review,
    serve,
)

RESTORE = ImageRestore(node="gpu-7", images={"trainer": "localhost/ckpt/trainer:1"})


def pod(
    pointer: str | None = RESTORE.pointer(), *, labelled: bool = True, **spec: Any
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": "train-", "annotations": {}}
    if labelled:
        metadata["labels"] = {RESTORE_LABEL: RESTORE_BY_IMAGE}
    if pointer is not None:
        metadata["annotations"][RESUME_FROM] = pointer
    containers = [
        {"name": "sidecar", "image": "proxy:1"},
        {"name": "trainer", "image": "train:1", "imagePullPolicy": "Always"},
    ]
    return {"metadata": metadata, "spec": {"containers": containers, **spec}}


def test_the_pointer_round_trips_and_other_pointers_are_not_images() -> None:
    assert image_restore(RESTORE.pointer()) == RESTORE
    assert image_restore("s3://bucket/step-1200") is None
    assert image_restore(None) is None
    for bad, says in (
        ("checkpoint-image:{", "not JSON"),
        ("checkpoint-image:[]", "not a JSON object"),
        ('checkpoint-image:{"images":{"a":"b"}}', "no node"),
        ('checkpoint-image:{"node":"n","images":{}}', "images must map"),
        ('checkpoint-image:{"node":"n","images":{"a":1}}', "images must map"),
        # The node goes into the telemetry's required nodes and a node selector as it is.
        ('checkpoint-image:{"node":"-x","images":{"a":"b"}}', "not a node name"),
        ('checkpoint-image:{"node":"n 1","images":{"a":"b"}}', "not a node name"),
        ("checkpoint-image:" + "[" * 100_000, "not JSON"),  # nested beyond the parser's depth
    ):
        with pytest.raises(Refused, match=says):
            image_restore(bad)


def test_a_labelled_pod_gets_its_checkpoint_image_pinned_to_its_node() -> None:
    assert mutation(pod()) == [
        {"op": "replace", "path": "/spec/containers/1/image", "value": "localhost/ckpt/trainer:1"},
        {"op": "add", "path": "/spec/containers/1/imagePullPolicy", "value": "Never"},
        {"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "gpu-7"}},
    ]
    # a nodeSelector of its own (a Kueue flavor's labels) is kept, the node added to it
    assert mutation(pod(nodeSelector={"pool": "a"}))[-1] == {
        "op": "add",
        "path": "/spec/nodeSelector/kubernetes.io~1hostname",
        "value": "gpu-7",
    }


def test_an_unlabelled_pod_is_left_alone_whatever_it_carries() -> None:
    assert mutation(pod(labelled=False)) == []
    assert mutation(pod("checkpoint-image:{", labelled=False)) == []


def test_a_labelled_pod_that_cannot_be_restored_is_refused() -> None:
    with pytest.raises(Refused, match="is missing"):
        mutation(pod(None))
    with pytest.raises(Refused, match="not a checkpoint image"):
        mutation(pod("s3://bucket/step-1"))
    other = ImageRestore(node="gpu-7", images={"learner": "x"}).pointer()
    with pytest.raises(Refused, match="container.s. learner that the pod does not have"):
        mutation(pod(other))


def admission(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-9", "kind": {"kind": "Pod"}, "operation": operation, "object": obj},
    }


def test_review_answers_with_a_json_patch_or_a_refusal() -> None:
    answer = review(admission(pod()))["response"]
    assert answer["uid"] == "u-9" and answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["patch"])) == mutation(pod())

    refused = review(admission(pod(None)))["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 422
    assert "is missing" in refused["status"]["message"]

    # only a pod's CREATE is changed
    assert review(admission(pod(), "UPDATE"))["response"] == {"uid": "u-9", "allowed": True}
    assert review(admission(pod(labelled=False)))["response"] == {"uid": "u-9", "allowed": True}

    for bad, field in (([], "kind"), ({"kind": "AdmissionReview"}, "request.uid")):
        with pytest.raises(ValueError, match=field):
            review(bad)


def tls_files(directory: Path) -> tuple[Path, Path, bytes]:
    """A CA of the test's own and a server certificate for 127.0.0.1 signed by it."""
    now = dt.datetime.now(dt.UTC)

    def certificate(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, Any], ca: bool
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(issuer[1], hashes.SHA256())

    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = certificate("shaper-test-ca", ca_key, ("shaper-test-ca", ca_key), ca=True)
    server = certificate("127.0.0.1", server_key, ("shaper-test-ca", ca_key), ca=False)
    cert, key = directory / "webhook.crt", directory / "webhook.key"
    cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key, ca.public_bytes(serialization.Encoding.PEM)


def post_review(ca: bytes, port: int, pod: dict[str, Any]) -> dict[str, Any]:
    """The webhook's answer to an AdmissionReview of ``pod``'s CREATE, asked directly."""
    context = ssl.create_default_context(cadata=ca.decode())
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": pod,
        },
    }
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}{PATH}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        return dict(json.load(answer)["response"])


def test_served_over_https_it_answers_reviews_and_refuses_what_is_not_one(
    tmp_path: Path,
) -> None:
    cert, key, ca = tls_files(tmp_path)
    server = serve("127.0.0.1", 0, certfile=str(cert), keyfile=str(key))
    port = server.server_address[1]
    try:
        answer = post_review(ca, port, pod())
        assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
        context = ssl.create_default_context(cadata=ca.decode())
        for body, status, says in ((b"[]", 400, "kind"), (b"{", 400, "Expecting")):
            request = urllib.request.Request(f"https://127.0.0.1:{port}{PATH}", data=body)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, context=context, timeout=10)
            assert refused.value.code == status and says in refused.value.read().decode()
    finally:
        server.shutdown()
        server.server_close()
