"""A lock a process holds on a file until it lets it go or ends, however it ends (the kernel drops it):
what keeps one process per worker slot (app/processes/slots.py) and per device claim (a plug-in's)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def try_lock(path: Path) -> int | None:
    """An exclusive lock on `path` (made if missing), held while the returned descriptor is open, or None when
    another holder has it. flock: per open file, so a second open in the same process is refused too. Not
    inherited by children."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
