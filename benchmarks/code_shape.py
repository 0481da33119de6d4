"""The shape of rlflow's code: size, signatures, and reads across object and package boundaries.

Reads every ``.py`` file under ``rlflow/`` with ``ast`` (nothing is imported or run) and prints:

- lines: every line of the files, and the lines that hold code (not blank, not only a comment; a
  docstring's lines count as code);
- the function with the most parameters, and every function with more than ``--max-params``
  (a method's leading ``self`` or ``cls`` is not counted; ``*args`` and ``**kwargs`` count one each);
- private attribute accesses on another object: ``x._name`` where ``x`` is not ``self`` or ``cls``
  (nor ``super()``, ``type(self)``, ``self.__class__``) and ``_name`` is not a dunder; per file with
  ``--verbose``;
- private imports across subpackages: a module or name whose dotted path has a part starting with
  ``_`` (not a dunder), imported from another top-level unit of ``rlflow/`` (a subpackage such as
  ``replay``, or the modules directly in ``rlflow/``, which form one unit), e.g.
  ``from rlflow.replay._item_kernels import add_items`` in ``rlflow/adders/``;
- upward imports: ``rlflow/replay/`` or ``rlflow/specs.py`` importing from ``rlflow.adders``, at the
  top of a file or inside a function;
- the README's line count.

    python benchmarks/code_shape.py                 # the table, the long signatures and the imports
    python benchmarks/code_shape.py --verbose       # also every private attribute access, by file
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "rlflow"
LOWER_LAYERS = ("rlflow.replay", "rlflow.specs")  # must not import from UPPER_LAYER
UPPER_LAYER = "rlflow.adders"
NON_CODE_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                   tokenize.ENCODING, tokenize.ENDMARKER}


@dataclass
class Shape:
    """What one pass over the package found."""

    files: int = 0
    lines: int = 0
    code_lines: int = 0
    signatures: list[tuple[int, str]] = field(default_factory=list)  # (parameters, "file:line qualname")
    private_reads: dict[str, list[str]] = field(default_factory=dict)  # file -> ["line: expr", ...]
    private_imports: list[tuple[int, str]] = field(default_factory=list)  # (names, "file:line statement")
    upward_imports: list[tuple[int, str]] = field(default_factory=list)


def is_private(name: str) -> bool:
    """``_name`` but not ``__name__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path, root: Path) -> str:
    """``rlflow/replay/table.py`` -> ``rlflow.replay.table``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str, root: Path) -> str:
    """The top-level unit of a module of the package: ``rlflow.replay.table`` (or ``rlflow.replay`` itself)
    -> ``rlflow.replay``; a module directly in the package (``rlflow.loop``, ``rlflow._step_kernels``), a
    name defined there, or the package itself -> ``rlflow``."""
    parts = module.split(".")
    if len(parts) >= 2 and (root / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return PACKAGE


def resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module of an import statement (relative imports resolved against ``importer``)."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def count_lines(source: str) -> tuple[int, int]:
    """(all lines, lines holding a token that is not a comment or whitespace)."""
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in NON_CODE_TOKENS:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(source.splitlines()), len(code)


def own_object(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()``, ``type(self)`` or ``self.__class__``: the object's own attributes."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and own_object(node.args[0]))
    if isinstance(node, ast.Attribute) and node.attr == "__class__":
        return own_object(node.value)
    return False


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    a = fn.args
    names = [p.arg for p in [*a.posonlyargs, *a.args]]
    count = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    if in_class and names and names[0] in ("self", "cls"):
        count -= 1
    return count


class FileVisitor(ast.NodeVisitor):
    """Collects one file's signatures, private attribute accesses and imports."""

    def __init__(self, shape: Shape, root: Path, rel: str, module: str, is_package: bool):
        self.shape, self.root, self.rel, self.module, self.is_package = shape, root, rel, module, is_package
        self.scope: list[tuple[str, bool]] = []  # (name, is a class)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append((node.name, True))
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        in_class = bool(self.scope) and self.scope[-1][1]
        qualname = ".".join([name for name, _ in self.scope] + [node.name])
        self.shape.signatures.append((parameter_count(node, in_class), f"{self.rel}:{node.lineno} {qualname}"))
        self.scope.append((node.name, False))
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr) and not own_object(node.value):
            self.shape.private_reads.setdefault(self.rel, []).append(f"{node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_import(node.lineno, alias.name, [None])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = resolve(node.module, node.level, self.module, self.is_package)
        self.check_import(node.lineno, source, [alias.name for alias in node.names])

    def check_import(self, lineno: int, source: str, names: list[str | None]) -> None:
        """Record the private names (or module) of one import statement that come from another unit, and an
        import of the upper layer from a lower one. ``names`` is ``[None]`` for ``import source``."""
        if source != PACKAGE and not source.startswith(PACKAGE + "."):
            return
        own = unit(self.module, self.root)
        private, upward = [], []
        for name in names:
            target = source if name is None or name == "*" else f"{source}.{name}"
            if any(is_private(part) for part in target.split(".")[1:]) and unit(target, self.root) != own:
                private.append(name)
            if self.in_lower_layer() and (target == UPPER_LAYER or target.startswith(UPPER_LAYER + ".")):
                upward.append(name)
        for found, into in ((private, self.shape.private_imports), (upward, self.shape.upward_imports)):
            if found:
                shown = f"import {source}" if found == [None] else f"from {source} import {', '.join(found)}"
                into.append((len(found), f"{self.rel}:{lineno}  {shown}"))

    def in_lower_layer(self) -> bool:
        return any(self.module == low or self.module.startswith(low + ".") for low in LOWER_LAYERS)


def measure(root: Path) -> Shape:
    shape = Shape()
    for path in sorted((root / PACKAGE).rglob("*.py")):
        source = path.read_text()
        rel = str(path.relative_to(root))
        lines, code = count_lines(source)
        shape.files += 1
        shape.lines += lines
        shape.code_lines += code
        FileVisitor(shape, root, rel, module_name(path, root), path.name == "__init__.py").visit(ast.parse(source, rel))
    return shape


def counted(imports: list[tuple[int, str]]) -> str:
    return f"{sum(n for n, _ in imports)} names in {len(imports)} statements"


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    parser.add_argument("--max-params", type=int, default=12, help="list functions with more parameters than this")
    parser.add_argument("--verbose", action="store_true", help="list every private attribute access, by file")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / PACKAGE).is_dir():
        parser.error(f"expected a repository root holding {PACKAGE}/, got {root}")

    shape = measure(root)
    reads = sum(len(v) for v in shape.private_reads.values())
    most, where = max(shape.signatures)
    long_ones = sorted((s for s in shape.signatures if s[0] > args.max_params), reverse=True)
    readme = root / "README.md"
    print(table([
        ("measure", "value"),
        ("files in rlflow/", str(shape.files)),
        ("lines in rlflow/ (all)", str(shape.lines)),
        ("lines in rlflow/ (code: not blank, not comment)", str(shape.code_lines)),
        ("functions", str(len(shape.signatures))),
        ("largest signature", f"{most} parameters: {where}"),
        (f"functions over {args.max_params} parameters", str(len(long_ones))),
        ("private attribute accesses on another object", f"{reads} in {len(shape.private_reads)} files"),
        ("private imports across subpackages", counted(shape.private_imports)),
        (f"upward imports ({', '.join(LOWER_LAYERS)} -> {UPPER_LAYER})", counted(shape.upward_imports)),
        ("README.md lines", str(len(readme.read_text().splitlines())) if readme.exists() else "no README.md"),
    ]))
    if long_ones:
        print(f"\nfunctions over {args.max_params} parameters:")
        for count, name in long_ones:
            print(f"  {count:3d}  {name}")
    for title, found in (("private imports across subpackages", shape.private_imports),
                         ("upward imports", shape.upward_imports)):
        if found:
            print(f"\n{title}:")
            print("\n".join(f"  {line}" for _, line in found))
    if shape.private_reads:
        print("\nprivate attribute accesses by file" + ("" if args.verbose else " (--verbose lists them)") + ":")
        for rel, found in sorted(shape.private_reads.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            names = Counter(line.split(": ", 1)[1].rsplit(".", 1)[-1] for line in found)
            common = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in names.most_common(4))
            print(f"  {len(found):4d}  {rel}  ({common}{', ...' if len(names) > 4 else ''})")
            if args.verbose:
                print("\n".join(f"          {line}" for line in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
