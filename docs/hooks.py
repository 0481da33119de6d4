"""mkdocs hooks: pages of the site that are files kept elsewhere in the repository.

``baselines/README.md``, ``benchmarks/README.md`` and ``benchmarks/RESULTS.md`` are read on a clone beside
the code they describe; the site shows each as a page of its own. Their relative links are written for
the clone: each is rewritten to the site's page for the same file (``../docs/loop.md`` to ``loop.md``,
``RESULTS.md`` to ``results.md``). A link to a file the site does not have fails the build.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

# site page -> the repository file it shows
INCLUDED = {
    "baselines.md": "baselines/README.md",
    "benchmarks.md": "benchmarks/README.md",
    "results.md": "benchmarks/RESULTS.md",
}
_PAGE_OF = {source: page for page, source in INCLUDED.items()}
_LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    source = INCLUDED.get(page.file.src_uri)
    if source is None:
        return markdown
    root = Path(config["config_file_path"]).parent
    text = (root / source).read_text(encoding="utf-8")
    folder = posixpath.dirname(source)

    def site_link(match: re.Match[str]) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        if "://" in target or target.startswith("mailto:"):
            return match.group(0)
        path = posixpath.normpath(posixpath.join(folder, target))
        if path.startswith("docs/"):
            return f"]({path[len('docs/'):]}{anchor})"
        if path in _PAGE_OF:
            return f"]({_PAGE_OF[path]}{anchor})"
        raise ValueError(f"{source} links to {target!r}, which the documentation site does not have")

    return _LINK.sub(site_link, text)
