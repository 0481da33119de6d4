"""The rlflow command: run a baseline by name.

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

USAGE = """\
rlflow: run one of rlflow's baselines by name.

usage: rlflow NAME [--flag value ...]   train baseline NAME (rlflow NAME --help lists its flags)
       rlflow list                     the baselines
       rlflow --version                rlflow's version

examples:
  rlflow dqn                           DQN on CartPole-v1, as python -m baselines.dqn
  rlflow dqn --evaluate runs/dqn       evaluate the learner that run saved
  rlflow ppo --env-id LunarLander-v3    PPO with LunarLander's preset (zoo's settings, 1M steps)
  rlflow ppo --list-presets            the envs PPO has presets for, their flags and sources
"""


def _baselines_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "baselines"


def available() -> list[str]:
    """Names of the baselines beside the installed package (empty when it was not installed from a clone)."""
    folder = _baselines_dir()
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")) if folder.is_dir() else []


def _listing(names: list[str]) -> str:
    return "baselines: " + (", ".join(names) if names else "none found (install from a clone: pip install -e .)")


def main(argv: list[str] | None = None) -> int:
    """Run the command with ``argv`` (default: the process's arguments); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not argv:  # no baseline named: say how to name one, and fail (a script calling it gave nothing to run)
        print(USAGE + "\n" + _listing(names), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(USAGE + "\n" + _listing(names))
        return 0
    if argv[0] in ("-V", "--version"):
        from rlflow import __version__

        print(f"rlflow {__version__}")
        return 0
    if argv[0] == "list":
        print(_listing(names))
        return 0 if names else 1
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"rlflow: unknown baseline {name!r}; expected one of {names or 'none (install from a clone)'} "
              "(rlflow --help for usage)", file=sys.stderr)
        return 2
    root = str(_baselines_dir().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"baselines.{name}")
    # The baseline's flags on top of the preset of the env they name (baselines/presets/NAME.yaml).
    module.main(module.parse_args(rest, prog=f"rlflow {name}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
