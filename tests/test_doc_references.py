"""Every repository path the README, docs/ and the source's docstrings and comments name exists.

A reference is a path starting with docs/, benchmarks/, src/, tests/, examples/,
scripts/ or gradsched/ (read under src/); ``{a,b}`` alternatives and ``*`` are expanded;
``bench_vgg_*`` (a prefix) must match at least one file.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = re.compile(r"(?<![\w/.-])((?:docs|benchmarks|src|tests|examples|scripts|gradsched)/[\w./*{},-]*[\w*}])")


def expand(ref: str) -> list[str]:
    """``a.{json,png}`` -> ``a.json``, ``a.png`` (every combination of every brace group)."""
    parts = re.split(r"\{([^{}]*)\}", ref)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def exists(path: str) -> bool:
    for base in (ROOT, ROOT / "src"):
        if any(True for _ in base.glob(path)) if "*" in path else (base / path).exists():
            return True
    return any(True for _ in ROOT.glob(path.rstrip(".") + "*"))  # a prefix, as in bench_vgg_


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("*.py")),
            *sorted((ROOT / "benchmarks").rglob("*.md"))]


def prose(path: Path) -> str:
    """A document's text; of a Python file, its docstrings and comments (code builds paths at run time)."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    nodes = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                                      ast.AsyncFunctionDef))]
    docs = [ast.get_docstring(n) or "" for n in nodes]
    comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    return "\n".join(docs + comments)


def references() -> list[tuple[str, str]]:
    """(document, path) for every path named."""
    return [(str(doc.relative_to(ROOT)), p) for doc in documents() for m in REF.finditer(prose(doc))
            for p in expand(m.group(1))]


def test_expand_and_exists_read_references_as_written():
    assert expand("benchmarks/results/bench_vgg_{2h,4h}.{json,png}") == [
        "benchmarks/results/bench_vgg_2h.json", "benchmarks/results/bench_vgg_2h.png",
        "benchmarks/results/bench_vgg_4h.json", "benchmarks/results/bench_vgg_4h.png"]
    assert exists("gradsched/cluster.py") and exists("docs/") and not exists("docs/no-such-page.md")


def test_every_path_named_in_the_docs_exists():
    refs = references()
    assert len({p for _, p in refs}) > 20  # the pattern does find the docs' references
    missing = [f"{doc}: {p}" for doc, p in refs if not exists(p)]
    assert not missing, "dangling references (fix the path or drop the mention):\n" + "\n".join(missing)
