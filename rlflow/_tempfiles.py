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
from pathlib import Path

__all__ = ["remove_leftovers", "temporary_path"]


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
