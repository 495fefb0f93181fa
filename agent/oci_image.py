"""Single-layer OCI image archives (oci-layout + index.json) that ``ctr images import``
takes, written from files on this host: no registry, no Docker, no buildah.

:func:`write_checkpoint_image` is the one the node agent uses (agent.kubelet): its one layer
is the kubelet's checkpoint archive as it is (a tar of config.dump, spec.dump,
checkpoint/, rootfs-diff.tar, ...), and its manifest carries
``org.criu.checkpoint.container.name=<container>``, the annotation by which containerd's
CRI (2.3.x, ``enable_experimental_restore_via_create``) restores a container whose image
it is, as buildah does it in containerd's contrib/checkpoint test.
:func:`write_files_image` packs host files as a root filesystem (the real node's busybox
and pause images). ``scripts/k8s/real-node/mkimage.py`` is the command line of both.

Standard library only: the real node's script runs this with the system's python3.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

# The manifest annotation that makes containerd's CRI restore a container from the image.
CHECKPOINT_CONTAINER_ANNOTATION = "org.criu.checkpoint.container.name"
_CHUNK = 1 << 20

# The node's own platform, as OCI names it: containerd imports and the CRI picks an image
# for the platform it runs on, so an arm64 node's checkpoint must say arm64.
_OCI_ARCHITECTURES = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}
ARCHITECTURE = _OCI_ARCHITECTURES.get(platform.machine().lower(), platform.machine().lower())


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))
    return digest


def _blob_file(tar: tarfile.TarFile, path: Path) -> tuple[str, int]:
    """A file as a blob, streamed twice (its digest, then its bytes); (digest, size)."""
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            sha.update(chunk)
            size += len(chunk)
    digest = sha.hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = size
    with path.open("rb") as f:
        tar.addfile(info, f)
    return digest, size


def files_layer(files: list[str]) -> bytes:
    """A layer of host files, each ``SRC:DEST[:LINK,LINK...]`` (the links are symlinks to
    DEST), with the folders a container expects (tmp, proc, sys, dev, etc, var/run)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs: set[str] = set()

        def mkdir(path: str) -> None:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    t.addfile(info)

        for d in ("tmp", "proc", "sys", "dev", "etc", "var/run"):
            mkdir(d + "/x")
            if d not in dirs:
                dirs.add(d)
                info = tarfile.TarInfo(d)
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if d == "tmp" else 0o755
                t.addfile(info)
        for spec in files:
            src, dest, *links = spec.split(":")
            mkdir(dest)
            data = Path(src).read_bytes()
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.size = len(data)
            info.mode = 0o755
            t.addfile(info, io.BytesIO(data))
            for link in links[0].split(",") if links else []:
                mkdir(link)
                li = tarfile.TarInfo(link.lstrip("/"))
                li.type = tarfile.SYMTYPE
                li.linkname = dest
                t.addfile(li)
    return buf.getvalue()


def write_image(
    out: Path,
    name: str,
    image_config: dict[str, object],
    add_layer: Callable[[tarfile.TarFile], tuple[str, int]],  # the layer blob's (digest, size)
    annotations: dict[str, str] | None = None,
) -> None:
    """An OCI image archive of one layer, named ``name`` (``repository:tag``) for
    ``ctr images import``."""
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"image name {name!r} has no tag")
    with tarfile.open(out, "w") as tar:
        layer_digest, layer_size = add_layer(tar)
        config = {
            "architecture": ARCHITECTURE,
            "os": "linux",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        }
        cfg = json.dumps(config).encode()
        cfg_digest = _blob(tar, cfg)
        manifest_obj: dict[str, object] = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{cfg_digest}",
                "size": len(cfg),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_digest}",
                    "size": layer_size,
                }
            ],
        }
        if annotations:
            manifest_obj["annotations"] = annotations
        manifest = json.dumps(manifest_obj).encode()
        man_digest = _blob(tar, manifest)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": f"sha256:{man_digest}",
                        "size": len(manifest),
                        "annotations": {
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                        },
                        "platform": {"architecture": ARCHITECTURE, "os": "linux"},
                    }
                ],
            }
        ).encode()
        layout = b'{"imageLayoutVersion":"1.0.0"}'
        for fname, data in (("oci-layout", layout), ("index.json", index)):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_files_image(
    out: Path, name: str, *, entrypoint: list[str], cmd: list[str], files: list[str]
) -> None:
    """An ordinary image of host files (:func:`files_layer`)."""
    layer = files_layer(files)
    write_image(
        out,
        name,
        {
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],
            "WorkingDir": "/",
        },
        lambda tar: (_blob(tar, layer), len(layer)),
    )


def checkpointed_container(archive: Path) -> str | None:
    """The container's name as the kubelet's checkpoint archive records it (config.dump's
    ``name``); None when the archive has none."""
    with tarfile.open(archive) as tar:
        try:
            member = tar.extractfile("config.dump")
        except KeyError:
            return None
        if member is None:
            return None
        name = json.load(member).get("name")
    return name if isinstance(name, str) and name else None


def write_checkpoint_image(out: Path, name: str, *, archive: Path, container: str) -> None:
    """The kubelet's checkpoint ``archive`` of ``container`` as checkpoint image ``name``."""
    write_image(
        out,
        name,
        {},
        lambda tar: _blob_file(tar, archive),
        {CHECKPOINT_CONTAINER_ANNOTATION: container},
    )
