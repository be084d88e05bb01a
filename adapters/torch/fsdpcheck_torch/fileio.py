"""Files written whole (a leaf module: no torch), as core/fileio.h does for the C side."""

import os


def write_whole(path, text, durable=False):
    """Writes text to path whole or not at all: a reader (a rank waiting for the
    plan, check collecting a rank's report, a loader) never sees half of it. The
    temporary name carries the pid, so that writers in several processes never
    share one. durable: on disk (fsync) before the rename, as a checkpoint must be."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
