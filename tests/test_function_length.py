"""No function is longer than a screen (60 lines, ``def`` to its last line) without saying why.

A longer one states its reason in a ``# long function: ...`` comment inside it.  Read
with ``ast``, nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 60
MARK = "# long function:"


def long_functions(path: Path) -> list[tuple[str, int, bool]]:
    """(name, lines, states a reason) of every function in ``path`` over :data:`MAX_LINES`."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES:
                body = lines[node.lineno - 1:node.end_lineno]
                out.append((node.name, n, any(MARK in line and line.split(MARK, 1)[1].strip() for line in body)))
    return out


def test_the_check_sees_a_long_function_and_its_reason(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))
    f = tmp_path / "m.py"
    f.write_text(f"def short():\n    pass\n\n\nif True:\n    def long():\n{body}\n\nclass C:\n"
                 f"    def reasoned(self):\n        {MARK} one table, row by row\n{body}")
    assert long_functions(f) == [("long", MAX_LINES + 1, False), ("reasoned", MAX_LINES + 2, True)]


def test_no_long_function_without_a_reason() -> None:
    found = [f"{path.relative_to(SRC)}: {name} ({n} lines)" for path in sorted(SRC.rglob("*.py"))
             for name, n, reason in long_functions(path) if not reason]
    assert not found, (f"functions over {MAX_LINES} lines: split them, or say why not in a '{MARK} ...' comment:\n"
                       + "\n".join(found))
