"""The code in the README and in docs/ runs as shown."""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_readme_first_look_runs():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A first look"):text.index("## Speed")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["sample"].data["observation"].shape == (32, 2, 4)
    assert scope["table"].size == 160


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's test command as the README writes it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("Run the tests"):]
    command = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert "pytest" in command and ci[-1] == command


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md") if python_blocks(p)))
def test_docs_examples_run(page, tmp_path):
    """Every python block of a page runs, in order, in one namespace (files land in a temporary folder)."""
    scope: dict = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for i, code in enumerate(python_blocks(ROOT / "docs" / page)):
            exec(compile(code, f"{page} block {i}", "exec"), scope)
    finally:
        os.chdir(cwd)
