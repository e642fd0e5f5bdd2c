"""docs/architecture.md names every package and module of pingctl, and nothing that is not there.

The rule a reader can follow (and a new module's author must): a package or module
`pingctl.a.b` (every `.py` under `pingctl/` but `__init__` and `__main__`, and every directory
holding one) is named when

- the page holds its dotted name, `pingctl.a.b`, or its file, `pingctl/a/b.py`, anywhere; or
- a row of a table whose first cell names one of its enclosing packages (`pingctl.a`) holds the
  rest of its dotted name in backticks: `b` in the `pingctl.a` row, `b.c` for `pingctl.a.b.c`
  (a leading package name is allowed too: `a.b` in that row).

The other way round, every dotted name `pingctl.x...` and every path `pingctl/x/....py` on the page
must exist: the longest prefix of a dotted name that is a module must exist, and what follows it,
if anything, must be a name that module defines (a function, class, constant or import) or one
of its submodules. Code blocks are left out both ways: an example may show a module yet to be
written."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pingctl"
DOC = ROOT / "docs" / "architecture.md"

DOTTED = re.compile(r"\bpingctl(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"\bpingctl/[A-Za-z0-9_/]+\.py\b")
TICKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)`")
# a code example may name a module that a reader would add (the engine of "Adding an engine")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def modules() -> set[str]:
    """Every package (a directory holding Python files) and module under pingctl/, dotted."""
    names = set()
    for f in PKG.rglob("*.py"):
        if "__pycache__" in f.parts:
            continue
        parts = f.relative_to(ROOT).with_suffix("").parts
        for i in range(2, len(parts)):  # the enclosing packages below pingctl itself
            names.add(".".join(parts[:i]))
        if parts[-1] not in ("__init__", "__main__"):
            names.add(".".join(parts))
    return names


def _table_rows(text: str) -> list[tuple[set[str], set[str]]]:
    """(packages the first cell names, backticked names of the whole row) per table row."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = line.split("|")[1:]
        first = set(DOTTED.findall(cells[0]))
        if first:
            rows.append((first, set(TICKED.findall(line))))
    return rows


def named_in(text: str, name: str, rows: list[tuple[set[str], set[str]]]) -> bool:
    if re.search(re.escape(name) + r"(?![A-Za-z0-9_])", text) or name.replace(".", "/") + ".py" in text:
        return True
    for packages, ticked in rows:
        for p in packages:
            if not name.startswith(p + "."):
                continue
            rest = name[len(p) + 1:]
            if rest in ticked or f"{p.rsplit('.', 1)[-1]}.{rest}" in ticked:
                return True
    return False


@cache
def _defined(module: str) -> frozenset[str]:
    """The top-level names a module (or package's __init__) defines, by reading its source."""
    base = PKG.parent.joinpath(*module.split("."))
    src = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    if not src.is_file():
        return frozenset()
    found = set()
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(found)


def resolves(dotted: str, known: set[str]) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in known or module == "pingctl":
            return i == len(parts) or parts[i] in _defined(module)
    return False


def _page() -> str:
    return FENCE.sub("", DOC.read_text())


def test_every_package_and_module_is_named():
    text = _page()
    rows = _table_rows(text)
    missing = sorted(m for m in modules() if not named_in(text, m, rows))
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_module_named_exists():
    text = _page()
    known = modules()
    gone = sorted({d for d in DOTTED.findall(text) if not resolves(d, known)})
    paths = sorted({p for p in PATH.findall(text) if not (ROOT / p).is_file()})
    assert not gone and not paths, f"docs/architecture.md names what does not exist: {gone + paths}"


def test_the_rule_reads_rows_and_dotted_names():
    """The rule on a made-up page, so a change to it shows here before it shows on the real one."""
    page = ("| layer | holds |\n|---|---|\n| `pingctl.eval` | `metrics`, `vivaldi` (serf's) |\n"
            "| `pingctl.records` | `records.layout`, `fanout.step` |\n\nAlso `pingctl.coords`.\n")
    rows = _table_rows(page)
    assert named_in(page, "pingctl.eval.metrics", rows) and named_in(page, "pingctl.coords", rows)
    assert named_in(page, "pingctl.records.layout", rows) and named_in(page, "pingctl.records.fanout.step", rows)
    assert not named_in(page, "pingctl.eval.plots", rows)  # not in its row
    assert named_in(page + "See pingctl/eval/plots.py.", "pingctl.eval.plots", rows)
    assert not named_in(page, "pingctl.coord", rows)  # a prefix of a name is not the name
    assert not named_in(page, "pingctl.records.metrics", rows)  # another package's row
    known = modules()
    assert resolves("pingctl.artifacts.table.load_split", known) and resolves("pingctl.schema", known)
    assert not resolves("pingctl.artifacts.table.no_such_function", known)
    assert not resolves("pingctl.no_such_module", known)
