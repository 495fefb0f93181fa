#!/usr/bin/env python3
"""Write a single-layer OCI image archive (oci-layout + index.json) that `ctr images import`
takes, from files on this host; no registry, no Docker.

  mkimage.py OUT.tar NAME ENTRYPOINT_JSON CMD_JSON SRC:DEST[:link,link...] ...
  mkimage.py --checkpoint OUT.tar NAME ARCHIVE CONTAINER

The second form is a checkpoint image: its one layer is the kubelet's checkpoint archive
as it is (a tar of config.dump, spec.dump, checkpoint/, rootfs-diff.tar, ...), and its
manifest carries org.criu.checkpoint.container.name=CONTAINER, the annotation by which
containerd's CRI (2.3.x, enable_experimental_restore_via_create) restores a container whose
image it is, as buildah does it in containerd's contrib/checkpoint test.
"""

import hashlib
import io
import json
import sys
import tarfile
import time
from collections.abc import Callable


def blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))
    return digest


def blob_file(tar: tarfile.TarFile, path: str) -> tuple[str, int]:
    """A file as a blob, streamed twice (its digest, then its bytes); (digest, size)."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
            size += len(chunk)
    digest = sha.hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = size
    with open(path, "rb") as f:
        tar.addfile(info, f)
    return digest, size


def layer(files: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = set()

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
            data = open(src, "rb").read()
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


def write(
    out: str,
    name: str,
    image_config: dict[str, object],
    add_layer: Callable[[tarfile.TarFile], tuple[str, int]],  # the layer blob's (digest, size)
    annotations: dict[str, str] | None = None,
) -> None:
    with tarfile.open(out, "w") as tar:
        layer_digest, layer_size = add_layer(tar)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        }
        cfg = json.dumps(config).encode()
        cfg_digest = blob(tar, cfg)
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
        man_digest = blob(tar, manifest)
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
                        "platform": {"architecture": "amd64", "os": "linux"},
                    }
                ],
            }
        ).encode()
        layout = b'{"imageLayoutVersion":"1.0.0"}'
        for fname, data in (("oci-layout", layout), ("index.json", index)):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def main() -> None:
    if sys.argv[1:2] == ["--checkpoint"]:
        out, name, archive, container = sys.argv[2:]
        write(
            out,
            name,
            {},
            lambda tar: blob_file(tar, archive),
            {"org.criu.checkpoint.container.name": container},
        )
        return
    out, name, entrypoint, cmd, *files = sys.argv[1:]
    layer_bytes = layer(files)
    write(
        out,
        name,
        {
            "Entrypoint": json.loads(entrypoint),
            "Cmd": json.loads(cmd),
            "Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],
            "WorkingDir": "/",
        },
        lambda tar: (blob(tar, layer_bytes), len(layer_bytes)),
    )


if __name__ == "__main__":
    main()
