"""A mutating admission webhook that makes a Job's new pod restore a kubelet checkpoint
(issue 15, checkpoint-aware preemption on Kueue: kubernetes-sigs/kueue#477).

containerd (2.2/2.3 with ``enable_experimental_restore_via_create``) restores a container
when the pod asks for a *checkpoint image* — the kubelet's checkpoint archive as a one-layer
OCI image (scripts/k8s/real-node/README.md) — as that container's image. A Job's pod
template image cannot change once the Job exists, even while it is suspended; its metadata
can. So the checkpoint is named in the template's metadata and this webhook puts it in the
pod when the Job controller creates one:

* the resume pointer (annotation ``shaper.io/resume-from``) of a checkpoint image is
  ``checkpoint-image:`` followed by JSON ``{"node": N, "images": {CONTAINER: IMAGE}}``
  (:class:`ImageRestore`, defined in wire.checkpoint_image: the node agent's answer,
  agent.kubelet): the node the image was imported on and, for each checkpointed
  container, its checkpoint image;
* the label ``shaper.io/restore: checkpoint-image`` says that the pod must be restored so;
  the webhook configuration sends only pods with it (``objectSelector``), so no other pod
  of the cluster passes here;
* on CREATE of such a pod the webhook sets each named container's ``image`` to its
  checkpoint image with ``imagePullPolicy: Never`` (the image exists on that node only) and
  pins the pod to the node (``nodeSelector`` ``kubernetes.io/hostname``).

A labelled pod whose pointer is missing, not a checkpoint image's, malformed, or names a
container the pod lacks is **refused** (the Job controller records ``FailedCreate`` with
this module's message and retries): started from its own image it would begin again from
nothing while Shaper believes its work kept. For the same reason the webhook configuration
(deploy/kubernetes/components/checkpoint-restore) has ``failurePolicy: Fail``: only
labelled pods reach it, and for them no pod is better than a silent restart. A checkpoint
image that is not on the node is the kubelet's to report: the pod waits with
``ErrImageNeverPull`` naming the image, and nothing runs.

``python -m connectors.kubernetes.restore_webhook --cert C --key K [--port 8443]`` serves
``POST /mutate`` (AdmissionReview v1) over HTTPS; :func:`serve` does the same in a thread.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
from collections.abc import Mapping, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from connectors.kubernetes.pins import RESTORE_LABEL as RESTORE_LABEL
from connectors.kubernetes.pods import HOSTNAME_LABEL, RESUME_FROM

# Re-exported: the pointer is the node agent's answer too, so it is defined in wire.
from wire.checkpoint_image import POINTER_PREFIX as POINTER_PREFIX
from wire.checkpoint_image import RESTORE_BY_IMAGE as RESTORE_BY_IMAGE
from wire.checkpoint_image import ImageRestore as ImageRestore
from wire.checkpoint_image import read_pointer
from wire.json_server import JsonHandler, JsonServer, server_tls

PATH = "/mutate"
# An AdmissionReview of one pod; the API server's own limit on a request is 3 MiB.
MAX_BODY = 3 * 1024 * 1024


class Refused(ValueError):
    """A labelled pod that cannot be restored as asked; the message says why."""


def image_restore(pointer: str | None) -> ImageRestore | None:
    """The checkpoint images a resume pointer names (wire.checkpoint_image.read_pointer);
    None for any other pointer (a path the workload restores itself from). A malformed
    checkpoint-image pointer raises :class:`Refused` naming what is wrong."""
    try:
        return read_pointer(pointer)
    except ValueError as error:
        raise Refused(f"{RESUME_FROM}: {error}") from None


def _escape(key: str) -> str:
    """A map key as one JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def mutation(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch that makes a pod restore its checkpoint images; ``[]`` for a pod
    without the label. Raises :class:`Refused` for a labelled pod that cannot be."""
    metadata = pod.get("metadata") or {}
    if (metadata.get("labels") or {}).get(RESTORE_LABEL) != RESTORE_BY_IMAGE:
        return []
    pointer = (metadata.get("annotations") or {}).get(RESUME_FROM)
    restore = image_restore(pointer)
    if restore is None:
        raise Refused(
            f"pod has label {RESTORE_LABEL}={RESTORE_BY_IMAGE} but its annotation "
            f"{RESUME_FROM} is {'missing' if pointer is None else 'not a checkpoint image'}; "
            "started from its own image it would begin again from nothing"
        )
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    names = [c.get("name") for c in containers]
    missing = sorted(set(restore.images) - set(names))
    if missing:
        raise Refused(
            f"{RESUME_FROM} names container(s) {', '.join(missing)} that the pod does not have "
            f"(it has {', '.join(str(n) for n in names)})"
        )
    patch: list[dict[str, Any]] = []
    for index, container in enumerate(containers):
        image = restore.images.get(container.get("name"))
        if image is None:
            continue
        at = f"/spec/containers/{index}"
        patch.append({"op": "replace", "path": f"{at}/image", "value": image})
        # "add" replaces a member that exists (RFC 6902)
        patch.append({"op": "add", "path": f"{at}/imagePullPolicy", "value": "Never"})
    if spec.get("nodeSelector"):
        patch.append(
            {
                "op": "add",
                "path": f"/spec/nodeSelector/{_escape(HOSTNAME_LABEL)}",
                "value": restore.node,
            }
        )
    else:
        patch.append(
            {"op": "add", "path": "/spec/nodeSelector", "value": {HOSTNAME_LABEL: restore.node}}
        )
    return patch


def review(body: Any) -> dict[str, Any]:
    """The AdmissionReview (v1) answering one; :class:`ValueError` naming the field for a
    request that is not one."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise ValueError("kind: not an AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise ValueError("request.uid: missing")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = (request.get("kind") or {}).get("kind")
    pod = request.get("object")
    if request.get("operation") == "CREATE" and kind == "Pod" and isinstance(pod, dict):
        try:
            patch = mutation(pod)
        except Refused as refused:
            response["allowed"] = False
            response["status"] = {"code": 422, "reason": "Invalid", "message": str(refused)}
        else:
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


class _Handler(JsonHandler):
    max_body = MAX_BODY

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] != PATH:
            self.answer(404, {"error": f"path: only POST {PATH}"})
            return
        body = self.read_body()
        if body is None:
            return
        try:
            answer = review(json.loads(body))
        except ValueError as error:
            self.answer(400, {"error": str(error)})
            return
        self.answer(200, answer)


def serve(host: str, port: int, *, certfile: str, keyfile: str) -> ThreadingHTTPServer:
    """Serve the webhook over HTTPS in a daemon thread; ``shutdown()`` then
    ``server_close()`` stop it."""
    server = JsonServer((host, port), _Handler)
    server.tls = server_tls(certfile, keyfile)
    threading.Thread(target=server.serve_forever, name="restore-webhook", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cert", required=True, help="TLS certificate (PEM)")
    parser.add_argument("--key", required=True, help="its private key (PEM)")
    # Loopback unless told: in a pod the manifest passes --host=0.0.0.0 (the API server
    # calls the Service, which reaches the pod's address, not its loopback).
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8443)
    args = parser.parse_args(argv)
    server = serve(args.host, args.port, certfile=args.cert, keyfile=args.key)
    try:
        threading.Event().wait()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
