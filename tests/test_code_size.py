"""The package stays readable in pieces: no function or method in pingctl/ is longer than 100
lines and no module longer than 800, so each part of a long computation has a name that says
what it does and can be read (and tested) on its own."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pingctl"
MAX_FUNCTION_LINES = 100
MAX_FILE_LINES = 800


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_function_is_longer_than_100_lines():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split into named helpers: " + "; ".join(long)


def test_no_module_is_longer_than_800_lines():
    long = [f"{p.relative_to(PACKAGE.parent)} ({n} lines)" for p in _modules()
            if (n := p.read_text().count("\n")) > MAX_FILE_LINES]
    assert not long, "split into modules: " + "; ".join(long)


def test_the_checks_see_the_whole_package():
    # a wrong root would make both checks pass on nothing
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {"shard.py", "tokenizer/decode.py", "synth/world.py", "cli/inspect_cmd.py"} <= names
