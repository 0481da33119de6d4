"""Per-env presets: the settings a baseline was tuned with for an env, picked by the env's name.

Each baseline's presets are data, one YAML table per baseline in ``baselines/presets/<baseline>.yaml``: an
entry per env id, holding the flags it sets (by their ``Args`` field names) and ``source``, where the values
come from (RL Baselines3 Zoo's published settings, or rlflow's own tuning and the runs behind it).

``--env-id NAME`` applies NAME's preset (an Atari game, ``ALE/<Game>-v5``, without one of its own takes the
``atari`` preset); a flag given on the command line wins over it; ``--preset none``
runs the plain defaults and ``--preset OTHER`` another env's preset. The run prints the preset it used (or,
for an env without one, a notice naming the flags that matter most), and ``train`` writes the resolved
settings to ``<logdir>/config.json``. ``--list-presets`` prints the table and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml

PRESETS_DIR = Path(__file__).resolve().parent / "presets"

A = TypeVar("A")


def load(baseline: str, args_type: type | None = None) -> dict[str, dict[str, Any]]:
    """``baselines/presets/<baseline>.yaml`` as {env id: {"source": str, "flags": {field: value}}}; with
    ``args_type``, every flag must be one of its fields (ValueError naming the file, the env and the flag)."""
    path = PRESETS_DIR / f"{baseline}.yaml"
    if not path.exists():
        return {}
    table = yaml.safe_load(path.read_text()) or {}
    fields = {f.name for f in dataclasses.fields(args_type)} if args_type is not None else None
    defaults = args_type() if args_type is not None else None
    presets = {}
    for env_id, entry in table.items():
        entry = dict(entry or {})
        source = entry.pop("source", None)
        if not source:
            raise ValueError(f"{path}: the preset of {env_id} has no source (where its values come from)")
        unknown = sorted(set(entry) - fields) if fields is not None else []
        if unknown:
            raise ValueError(f"{path}: the preset of {env_id} sets {unknown}, which are not flags of {baseline} "
                             f"(its flags: {sorted(fields or ())})")
        if defaults is not None:
            for flag, value in entry.items():
                if not _fits(value, getattr(defaults, flag)):
                    raise ValueError(f"{path}: the preset of {env_id} sets {flag} to {value!r}; expected a value "
                                     f"like its default {getattr(defaults, flag)!r}")
        presets[str(env_id)] = {"source": str(source), "flags": entry}
    return presets


def _fits(value: Any, default: Any) -> bool:
    """Whether a preset's ``value`` has the kind of the field's ``default`` (an int where a float is; a list
    where a tuple is; anything where the default is None)."""
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, tuple):
        return isinstance(value, list | tuple)
    return isinstance(value, type(default))


def listing(baseline: str, args_type: type, env_field: str = "env_id") -> str:
    """The presets of ``baseline``: each env id, its source and the flags it sets."""
    presets = load(baseline, args_type)
    if not presets:
        return f"{baseline}: no presets"
    flag = env_field.replace("_", "-")
    lines = [f"{baseline} presets ({PRESETS_DIR.name}/{baseline}.yaml); --{flag} NAME applies NAME's:"]
    for env_id, entry in presets.items():
        flags = " ".join(_flag(k, v) for k, v in entry["flags"].items())
        lines.append(f"  {env_id}: {flags or '(the defaults)'}\n      source: {entry['source']}")
    return "\n".join(lines)


def _flag(name: str, value: Any) -> str:
    """A preset's setting as the command-line flag that gives it (``--no-NAME`` for False)."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    if isinstance(value, list | tuple):
        return f"--{flag} " + " ".join(str(v) for v in value)
    return f"--{flag} {value}"


def parse(args_type: type[A], baseline: str, argv: list[str] | None = None, *, prog: str | None = None,
          hint: str = "", env_field: str = "env_id") -> A:
    """The baseline's ``Args`` from the command line ``argv`` (default: the process's), on top of the preset of
    the env it names in ``env_field``, or of a run's ``--config`` (see the module docstring). ``hint`` names the
    flags that matter most, for the notice an env without a preset gets."""
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(f"--{env_field.replace('_', '-')}", f"--{env_field}", dest="env")
    pre.add_argument("--preset")
    pre.add_argument("--config")
    pre.add_argument("--list-presets", "--list_presets", dest="list_presets", action="store_true")
    known, _ = pre.parse_known_args(argv)
    if known.list_presets:
        print(listing(baseline, args_type, env_field))
        raise SystemExit(0)
    if known.config:
        saved = read_config(Path(known.config), args_type)
        args = tyro.cli(args_type, default=args_type(**typed(args_type, saved)), args=argv, prog=prog)
        print(f"config: {known.config} (its settings; the command line's flags win)")
        return args
    presets = load(baseline, args_type)
    env_id = known.env or getattr(args_type(), env_field)
    choice = known.preset or "auto"
    if choice == "none":
        name = None
    elif choice == "auto":
        name = env_id if env_id in presets else None
        if name is None and env_id.startswith("ALE/") and "atari" in presets:  # every Atari game: one preset
            name = "atari"
    elif choice in presets:
        name = choice
    else:
        raise SystemExit(f"{prog or baseline}: --preset {choice}: expected auto, none or one of {sorted(presets)} "
                         "(--list-presets shows them)")
    flags = typed(args_type, presets[name]["flags"]) if name is not None else {}
    defaults = args_type(**{**flags, env_field: env_id, "preset": choice})
    args = tyro.cli(args_type, default=defaults, args=argv, prog=prog)
    if name is not None:
        given = sorted(k for k in flags if getattr(args, k) != flags[k])
        overridden = f"; the command line sets {', '.join(given)}" if given else ""
        print(f"preset: {name} ({presets[name]['source']}){overridden}")
    elif choice == "none":
        print("preset: none (the plain defaults)")
    else:
        print(f"no preset for {env_id}: the defaults (presets: {', '.join(presets) or 'none'}; --list-presets shows "
              f"them); the flags that matter most here: {hint}")
    return args


def typed(args_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` for ``args_type``'s fields: a list (from YAML or JSON) where the default is a tuple becomes one."""
    defaults = args_type()
    return {k: tuple(v) if isinstance(v, list) and isinstance(getattr(defaults, k, None), tuple) else v
            for k, v in values.items()}


def write_config(args: Any) -> Path:
    """Every setting of the run (after its preset and its command line) as ``<logdir>/config.json``; ``--config``
    with that file runs the same settings again."""
    path = Path(args.logdir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    return path


def read_config(path: Path, args_type: type) -> dict[str, Any]:
    """A ``config.json`` :func:`write_config` wrote, checked against ``args_type``'s fields (ValueError naming
    a setting this baseline does not have)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--config {path}: expected a run's config.json, got {type(e).__name__}: {e}") from None
    if not isinstance(saved, dict):
        raise SystemExit(f"--config {path}: expected a run's config.json (an object of settings), got "
                         f"{type(saved).__name__}")
    fields = {f.name for f in dataclasses.fields(args_type)}
    unknown = sorted(set(saved) - fields)
    if unknown:
        raise SystemExit(f"--config {path}: settings {unknown} are not flags of this baseline (a config.json of "
                         "another baseline?)")
    saved.pop("config", None)
    return saved
