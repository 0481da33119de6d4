"""The ``rlflow`` command: run a baseline by name.

    rlflow dqn --env-id CartPole-v1          # the same as: python -m baselines.dqn --env-id CartPole-v1
    rlflow list                              # the baselines there are

The baselines live in the repository's ``baselines/`` folder beside the ``rlflow`` package (they are
examples to read and copy, not part of the installed library), so the command works from a clone of
the repository installed with ``pip install -e .``, as the README sets it up.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

__all__ = ["main"]


def _baselines_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "baselines"


def available() -> list[str]:
    """Names of the baselines beside the installed package (empty when it was not installed from a clone)."""
    folder = _baselines_dir()
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")) if folder.is_dir() else []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip().splitlines()[0])
        print("usage: rlflow NAME [--flag value ...]   (rlflow NAME --help for its flags)")
        print("baselines: " + (", ".join(names) if names else "none found (install from a clone: pip install -e .)"))
        return 0 if not argv or argv[0] != "list" or names else 1
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"rlflow: unknown baseline {name!r}; expected one of {names or 'none (install from a clone)'}",
              file=sys.stderr)
        return 2
    root = str(_baselines_dir().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"baselines.{name}")
    import tyro

    module.main(tyro.cli(module.Args, args=rest, prog=f"rlflow {name}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
