"""One owner per run folder: ``RunLock`` holds ``run.lock`` in the folder for as long as a trainer
writes there, so a second ``refimpl train`` or ``--resume`` on the same folder is refused in one
line naming the process that holds it.

The lock is an ``flock`` on the file (the kernel releases it when the process ends, however it
ends: a SIGKILL or an out-of-memory kill included), and the file names its holder (pid, host,
start time, command). A file left behind by a process that died is a stale lock: it is taken over
and reported (``RunLock.stale``: its pid and host), never mistaken for a live run. A normal exit
deletes the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

__all__ = ["LOCK_NAME", "FolderInUse", "RunLock", "describe_holder"]

LOCK_NAME = "run.lock"


class FolderInUse(Exception):
    """Another live process holds the folder's lock; ``holder`` is what its lock file says."""

    def __init__(self, path: Path, holder: dict):
        super().__init__(f"{path} is held by {describe_holder(holder)}")
        self.path, self.holder = path, holder


def describe_holder(holder: dict) -> str:
    """``pid 123 on host h (started 2025-01-01 12:00:00: refimpl train ...)``, from a lock file's
    record (fields it lacks are left out)."""
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    details = [holder.get("started", ""), holder.get("command", "")]
    details = [d for d in details if d]
    return f"{text} ({': '.join(details)})" if details else text


def _read_holder(fd: int) -> dict:
    """The record in an open lock file (empty or unreadable: ``{}``)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    try:
        record = json.loads(data.decode("utf-8", errors="replace") or "{}")
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def _this_process() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": _command_line(),
    }


def _command_line(width: int = 160) -> str:
    """This process's command line as typed (``python -m refimpl train ...``), cut to ``width``."""
    words = getattr(sys, "orig_argv", None) or sys.argv or [sys.executable]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 3] + "..."


class RunLock:
    """The lock of the folder ``root`` (``root/run.lock``), taken by ``acquire()`` (``FolderInUse``
    if a live process holds it) and given back by ``release()`` (also a context manager).
    ``stale``: the record of a dead holder whose lock file this one took over, else None."""

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_NAME
        self.stale: dict | None = None
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _read_holder(fd)
                os.close(fd)
                if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise FolderInUse(self.path, holder) from None
                raise
            # the holder may have deleted the file between our open and our flock: lock the file
            # that is at the path now, not an unlinked one
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_holder(fd)
        self.stale = previous or None
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(_this_process()) + "\n").encode())
        except OSError:  # a full disk: give the lock back, leave no half-written file
            self.release()
            raise
        return self

    def release(self) -> None:
        """Delete the lock file and let go of the lock (nothing if not held)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:  # a folder gone read-only: the file stays, and reads as a stale lock
            pass
        finally:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False
