"""Temporary files of atomic saves: ``.<name>.tmp-<pid>`` beside the target, and the removal of those a
killed save left.

A save writes the temporary file, flushes it and renames it over the target; a process killed before
the rename leaves the file (as large as what it saved). The next save of the same target removes the
temporary files of processes that no longer run: a running process's file may be a save in progress,
and every other file is left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "fsync_dir", "remove_leftovers", "temporary_path"]


def atomic_write(target: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``target`` through ``write(file)`` atomically: the leftovers of killed saves removed, then a
    temporary file written, flushed to disk and renamed over ``target``, and the directory flushed. A
    ``write`` that raises leaves ``target`` as it was and no temporary file."""
    remove_leftovers(target)
    tmp = temporary_path(target)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(target.parent)


def fsync_dir(path: Path) -> None:
    """Flush directory ``path`` to disk (a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_path(target: Path) -> Path:
    """Where this process writes ``target`` before renaming it into place."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}")


def remove_leftovers(target: Path) -> None:
    """Remove the temporary files of earlier saves of ``target`` whose process is gone."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.tmp-(\d+)")
    for left in target.parent.iterdir():
        match = pattern.fullmatch(left.name)
        if match and left.is_file() and not _running(int(match.group(1))):
            left.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (this process's own file is replaced by its save)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, OSError):  # it exists but is another user's, or the id is out of range
        return True
    return True
