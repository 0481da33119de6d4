"""The documentation site: its API reference covers every public name, and its build helpers (docs/hooks.py,
docs/sphinx_roles.py) turn the repository's links and the docstrings' roles into the site's links.

The site itself is built by the README's test command (``mkdocs build --strict``), which fails on a broken
link, a missing page or an unresolved cross-reference."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

import griffe
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# compat's modules are listed one by one; the loop's names are rlflow's
INTERNAL_PACKAGES = {"rlflow.compat", "rlflow.loop"}


def load_helper(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


roles = load_helper("sphinx_roles")
hooks = load_helper("hooks")


def api_pages() -> dict[str, str]:
    """module -> its API page (each page under docs/api renders one module with ``::: module``)."""
    out = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        modules = re.findall(r"^::: (\S+)", page.read_text(), re.M)
        assert len(modules) == 1, f"{page.name}: expected one ::: directive, got {modules}"
        out[modules[0]] = f"api/{page.name}"
    return out


def nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    return [p for value in nav.values() for p in nav_pages(value)]


def test_every_public_module_has_an_api_page_in_the_nav():
    pages = api_pages()
    assert set(pages) == set(roles.PUBLIC_MODULES)
    packages = {f"rlflow.{p.parent.name}" for p in (ROOT / "rlflow").glob("*/__init__.py")}
    assert packages - INTERNAL_PACKAGES <= set(roles.PUBLIC_MODULES), "a package with no API page"
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    listed = nav_pages(config["nav"])
    assert set(pages.values()) <= set(listed)
    assert sorted(set(listed)) == sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("module", roles.PUBLIC_MODULES)
def test_every_public_name_has_a_docstring_the_reference_shows(module):
    """The reference shows the names of each module's ``__all__`` that have a docstring: every one must."""
    loaded = griffe.load(module, search_paths=[str(ROOT)], allow_inspection=False)
    names = [n for n in importlib.import_module(module).__all__ if not (n.startswith("__") and n.endswith("__"))]
    undocumented = []
    for name in names:
        member = loaded[name]
        target = member.final_target if member.is_alias else member
        if target.is_module:
            continue  # shown on its own page
        if not (target.docstring and target.docstring.value.strip()):
            undocumented.append(name)
    assert undocumented == []


def rewritten(docstring: str, path: str) -> str:
    """The docstring of the object at ``path`` as the extension rewrites it."""
    extension = roles.SphinxRoles()
    module = griffe.Module("rlflow.replay.table")
    cls = griffe.Class("TableBase", parent=module)
    module.set_member("TableBase", cls)
    obj = cls if path.endswith("TableBase") else griffe.Function(path.rpartition(".")[2], parent=cls)
    obj.docstring = griffe.Docstring(docstring, parent=obj)
    extension.on_instance(node=None, obj=obj, agent=None)
    return obj.docstring.value


def test_roles_become_links_to_what_the_reference_shows_and_code_otherwise():
    got = rewritten(":class:`~rlflow.replay.Table`, :class:`rlflow.replay.Table`, :meth:`sample`, "
                    ":meth:`insert_many`, :func:`rlflow.run`, :meth:`_draw`, :mod:`rlflow.replay.nothing`, "
                    ":class:`~rlflow.replay.table.Table`, :class:`Nothing`",
                    "rlflow.replay.table.TableBase.insert")
    assert got == ("[`Table`][rlflow.replay.Table], [`rlflow.replay.Table`][rlflow.replay.Table], "
                   "[`sample`][rlflow.replay.TableBase.sample], "
                   "[`insert_many`][rlflow.replay.TableBase.insert_many], [`rlflow.run`][rlflow.run], "
                   "`_draw`, `rlflow.replay.nothing`, [`Table`][rlflow.replay.Table], `Nothing`")


@pytest.mark.parametrize(("target", "want"), [
    ("../docs/loop.md#checkpoints-and-resume", "loop.md#checkpoints-and-resume"),
    ("RESULTS.md", "results.md"),
    ("README.md#setup", "benchmarks.md#setup"),
    ("../baselines/README.md#learning-results", "baselines.md#learning-results"),
    ("https://example.org/x.md", "https://example.org/x.md"),
])
def test_included_pages_links_become_site_links(target, want, tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "README.md").write_text(f"see [there]({target}).\n")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="benchmarks.md"))
    out = hooks.on_page_markdown("placeholder", page, {"config_file_path": str(tmp_path / "mkdocs.yml")}, None)
    assert out == f"see [there]({want}).\n"


def test_a_link_to_a_file_the_site_lacks_fails_the_build(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "README.md").write_text("the code: [dqn](dqn.py)\n")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="baselines.md"))
    with pytest.raises(ValueError, match=r"baselines/README.md links to 'dqn.py'"):
        hooks.on_page_markdown("", page, {"config_file_path": str(tmp_path / "mkdocs.yml")}, None)
    other = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="loop.md"))
    assert hooks.on_page_markdown("# Loop\n", other, {"config_file_path": str(tmp_path / "x")}, None) == "# Loop\n"
