"""Writing a run's files so that a failed write loses nothing: ``write_atomic`` (a temporary file,
flushed to disk, then renamed over the old one; on failure the temporary file is removed and the
old file is untouched), ``append_line`` (on failure the file is cut back to its previous length,
so no torn record stays) and ``IOFailure``: any ``OSError`` (disk full, quota, permissions, a
read-only or vanished folder) as one line naming the path and the system's own words for it
(``No space left on device``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["IOFailure", "write_atomic", "append_line", "temporary_path"]


class IOFailure(OSError):
    """An ``OSError`` while writing ``path``; ``str()`` is one line: the path, the system's text
    for the error and its errno name."""

    def __init__(self, path, err: OSError):
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        import errno

        name = errno.errorcode.get(self.errno, "") if self.errno is not None else ""
        return f"cannot write {self.path}: {self.strerror}" + (f" ({name})" if name else "")


def temporary_path(path: Path) -> Path:
    """Where ``write_atomic`` writes ``path`` before renaming it."""
    return path.with_name(path.name + ".tmp")


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Replace ``path`` by ``data`` atomically and durably (written, fsynced, renamed). On any
    ``OSError`` the temporary file is removed, ``path`` keeps its old content and ``IOFailure``
    names the file that could not be written."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        _remove_quietly(tmp)
        raise IOFailure(path, err) from None
    return path


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` and a newline to ``path``; on any ``OSError`` the file is cut back to its
    length before (no partial record left) and ``IOFailure`` names it."""
    path = Path(path)
    data = (line + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                _write_all(fd, data)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)
    except OSError as err:
        raise IOFailure(path, err) from None


def _write_all(fd: int, data: bytes) -> None:
    done = 0
    while done < len(data):
        done += _write(fd, data[done:])


_write = os.write  # the one call that writes bytes (tests put a full disk here)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
