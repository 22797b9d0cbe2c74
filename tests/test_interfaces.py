"""The wrapper and its optimizer are reached through their interfaces, never through their private attributes.

The same holds for the executor the wrapper owns (its partners use its public members: ``retire_alone``
decides, the executor retires).  ``DistributedDataParallel`` shows its optimizer, the in-flight guard and integrations a
:class:`~gradsched.torch.runtime.link.ModelLink` (``model.link``); the optimizer shows the wrapper and
the forward gate an :class:`~gradsched.torch.runtime.link.UpdateLink`.  Read from the source with
``ast`` (nothing is imported): any other module of the package that reads or writes one of their
private attributes (``model._executor``, ``opt._pending``, ``getattr(model, "_ddp")``, ``ex._retire``) fails
here, and so does a benchmark, example or script that does (users copy them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gradsched"
SCANNED = (SRC, ROOT / "benchmarks", ROOT / "examples", ROOT / "scripts")  # the package and the code users copy

# class -> the module that defines it (and alone may read its privates)
OWNERS = {"DistributedDataParallel": SRC / "torch" / "runtime" / "wrapper.py",
          "DistributedOptimizer": SRC / "torch" / "runtime" / "optim.py",
          "Executor": SRC / "torch" / "runtime" / "executor.py"}
# (module, expression): a read the by-name scan matches that is another class's attribute of the same name
NOT_THEIRS = {("torch/runtime/autotune.py", "tracer._lock")}  # the Tracer's lock, not the executor's


def private_names(source: str, cls: str) -> set[str]:
    """The private attributes class ``cls`` defines in ``source``: its ``_methods`` and every ``self._x`` it sets."""
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    names = {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for n in ast.walk(node):
        if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                and n.value.id == "self"):
            names.add(n.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _own(value: ast.expr) -> bool:
    """``self.x``, ``cls.x``, ``super().x``: an object's own attribute, not another's."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def _imported(tree: ast.AST) -> set[str]:
    """Names bound by imports (``c10d``, ``torch``): their attributes are another package's, not ours."""
    return {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}


def private_reads(source: str, names: set[str]) -> list[str]:
    """``line: expression`` of every access to one of ``names`` on another object (``x._name``, and
    ``getattr``/``setattr``/``hasattr`` with the name as a constant), but on an imported module."""
    tree = ast.parse(source)
    modules = _imported(tree)
    out: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        if not isinstance(n, (ast.Attribute, ast.Call)):
            continue
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules:
            continue
        if isinstance(n, ast.Attribute) and n.attr in names and not _own(n.value):
            out.append((n.lineno, ast.unparse(n)))
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "setattr", "hasattr")
              and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and n.args[1].value in names
              and not _own(n.args[0])):
            out.append((n.lineno, ast.unparse(n)))
    return [f"{line}: {text}" for line, text in sorted(out)]


def test_the_scan_finds_a_private_read_and_passes_own_attributes():
    names = private_names("class DistributedDataParallel:\n"
                          "    def __init__(self):\n        self._executor = None\n        self.plan = None\n"
                          "    def _finish(self):\n        pass\n", "DistributedDataParallel")
    assert names == {"_executor", "_finish"}
    code = ("import c10d\ndef f(model, self):\n    model._executor.settle_all()\n    getattr(model, '_finish')()\n"
            "    self._executor = 1\n    model.plan\n    super()._finish()\n    c10d._executor\n")
    assert private_reads(code, names) == ["3: model._executor", "4: getattr(model, '_finish')"]


@pytest.mark.parametrize("cls", sorted(OWNERS))
def test_no_other_module_reads_a_private_of(cls):
    owner = OWNERS[cls]
    names = private_names(owner.read_text(), cls)
    assert {"_executor", "_optimizer"} <= names or {"_pending"} <= names or {"_retire"} <= names  # sees its state
    found = []
    for path in sorted(p for root in SCANNED for p in root.rglob("*.py")):
        if path == owner:
            continue
        rel = path.relative_to(SRC).as_posix() if path.is_relative_to(SRC) else ""
        found += [f"{path.relative_to(ROOT)}:{hit}" for hit in private_reads(path.read_text(), names)
                  if (rel, hit.split(": ", 1)[1]) not in NOT_THEIRS]
    assert not found, (f"private attributes of {cls} read from other modules (use its interface, "
                       f"gradsched.torch.runtime.link, or add a member there): {found}")
