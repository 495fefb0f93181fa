#!/usr/bin/env python3
"""Write a single-layer OCI image archive (oci-layout + index.json) that `ctr images import`
takes, from files on this host; no registry, no Docker.

  mkimage.py OUT.tar NAME ENTRYPOINT_JSON CMD_JSON SRC:DEST[:link,link...] ...
  mkimage.py --checkpoint OUT.tar NAME ARCHIVE CONTAINER

The second form is a checkpoint image: its one layer is the kubelet's checkpoint archive
as it is, and its manifest carries org.criu.checkpoint.container.name=CONTAINER, the
annotation by which containerd's CRI restores a container whose image it is. The writer is
the node agent's own (agent/oci_image.py, standard library only); this is its command line.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from agent.oci_image import write_checkpoint_image, write_files_image  # noqa: E402


def main() -> None:
    if sys.argv[1:2] == ["--checkpoint"]:
        out, name, archive, container = sys.argv[2:]
        write_checkpoint_image(Path(out), name, archive=Path(archive), container=container)
        return
    out, name, entrypoint, cmd, *files = sys.argv[1:]
    write_files_image(
        Path(out), name, entrypoint=json.loads(entrypoint), cmd=json.loads(cmd), files=files
    )


if __name__ == "__main__":
    main()
