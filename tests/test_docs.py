"""The code in the README runs as shown."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_first_look_runs():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A first look"):text.index("## Benchmarks")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["sample"].data["observation"].shape == (32, 2, 4)
    assert scope["table"].size == 160
