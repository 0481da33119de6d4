"""The code in the README and in docs/ runs as shown."""

import os
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def readme_section(heading: str) -> str:
    """The text of the README's section ``## heading``, up to the next ``## `` heading."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def run_readme_block(heading: str) -> dict:
    code = re.search(r"```python\n(.*?)```", readme_section(heading), re.S).group(1)
    scope: dict = {}
    exec(compile(code, f"README.md, {heading}", "exec"), scope)
    return scope


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 150, f"README.md has {lines} lines; keep it at most 150 (details go to docs/)"


def test_readme_replay_buffer_program_runs():
    scope = run_readme_block("A replay buffer in your loop")
    batch = scope["batch"]
    assert batch.observation.shape == (64, 4) and batch.next_observation.shape == (64, 4)
    assert batch.reward.shape == (64,) and batch.discount.shape == (64,)
    assert np.isin(batch.discount, np.float32([0, 0.99, 0.99**2, 0.99**3])).all()
    assert 990 <= len(scope["buffer"]) <= 1_000   # one transition per step; up to 2 wait for n_step=3


def test_readme_learner_program_runs():
    scope = run_readme_block("Your own learner")
    result = scope["result"]
    assert result.env_steps == 5_000 and result.learner_steps > 0
    assert set(result.learner_metrics) == {"loss"} and np.isfinite(result.learner_metrics["loss"])


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's test command as the README writes it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("Run the tests"):]
    command = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert "pytest" in command and ci[-1] == command


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md") if python_blocks(p)))
def test_docs_examples_run(page, tmp_path, request):
    """Every python block of a page runs, in order, in one namespace (files land in a temporary folder); the
    distributed page's on the session's local Ray instance."""
    if page == "distributed.md":
        request.getfixturevalue("ray_local")
    scope: dict = {"__name__": f"docs_{page[:-3]}"}  # a module no process imports: Ray pickles its code by value
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for i, code in enumerate(python_blocks(ROOT / "docs" / page)):
            exec(compile(code, f"{page} block {i}", "exec"), scope)
    finally:
        os.chdir(cwd)


# Every page a user reads, and what its links and file names must resolve to.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]
TOP_LEVEL = {".ci", "baselines", "benchmarks", "docs", "examples", "rlflow", "tests"}
SOURCE_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg", ".json"}


def without_code_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens, repeats -1, -2."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in without_code_blocks(page.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_references(page: Path) -> list[str]:
    """Relative links that name no file (or no heading of it), and backticked repository paths that name none."""
    text = without_code_blocks(page.read_text())
    broken = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"link ({target}): no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(f"link ({target}): {file.name} has no heading with anchor #{anchor}")
    for code in re.findall(r"`([^`\n]+)`", text):
        path = code.split("::")[0]
        if not re.fullmatch(r"[\w.\-]+(/[\w.\-]+)*/?", path) or "/" not in path:
            continue
        if path.split("/")[0] in TOP_LEVEL or Path(path).suffix in SOURCE_SUFFIXES:
            if not (ROOT / path).exists():
                broken.append(f"`{code}`: no such file in the repository")
    return broken


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_pages_point_only_to_what_exists(page):
    """Every relative link (and its #heading) and every backticked path such as `benchmarks/replay.py` in the
    README, docs/ and benchmarks/ names a file of the repository."""
    assert broken_references(ROOT / page) == []


def test_the_reference_check_catches_a_missing_file_and_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## A `b` heading\n\n[ok](#a-b-heading) [gone](#nothing) [file](missing.md)\n"
                    "`rlflow/__init__.py` `examples/none.py` `observation/obs` `runs/dqn/learner.pt`\n")
    assert broken_references(page) == [
        "link (#nothing): page.md has no heading with anchor #nothing",
        f"link (missing.md): no file {tmp_path / 'missing.md'}",
        "`examples/none.py`: no such file in the repository",
    ]
