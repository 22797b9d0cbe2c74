"""The package's layers hold: no import circles, and no import runs back up a layer.

Layers, bottom to top: the planning core (formats, cluster, profile, plan, planners,
simulator, timelines), then ``torch.runtime`` and ``torch.measure``, then ``integrations``
(Lightning, DDP comm hooks, the HF Trainer), then ``torch.jobs``, then ``commands``, then
``cli``.  Kept old import paths (``REEXPORTS``) are thin re-exports of the modules that moved,
outside the layers.  Every import is counted, also those inside functions
and under ``TYPE_CHECKING``: a deferred import is still a dependency.  Read from the
source with ``ast``, so nothing is imported (like tests/test_no_torch.py for torch).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Imports that still run up a layer, each with the step of issue 19 that removes it.  The
# test fails once one is gone, so that the entry is deleted with it.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under src/gradsched."""
    out = {}
    for path in sorted((src / "gradsched").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _imported(name: str, is_pkg: bool, node: ast.AST, known: set[str]) -> set[str]:
    """The gradsched modules one import statement loads (a package's ``__init__`` counts
    only when a name is taken from it, not when a submodule is)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names} & known
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[:len(pkg) - node.level + 1]
        base = ".".join(pkg + ([base] if base else []))
    subs = {f"{base}.{a.name}" for a in node.names} & known
    from_init = len(subs) < len(node.names)
    return subs | ({base} & known if from_init else set())


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the gradsched modules it imports anywhere in its source."""
    mods = _modules(src)
    known = set(mods)
    graph = {}
    for name, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _imported(name, is_pkg, node, known)
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# The planning core is defined by exclusion, so that a new module joins it without an edit here:
# everything but the torch package, the integrations, the command line and the package's facade.
NOT_CORE = ("gradsched.torch", "gradsched.integrations", "gradsched.commands", "gradsched.cli", "gradsched.lightning",
            "gradsched.hf")
# Old import paths kept working after a move: each only re-exports (tests/integrations/test_layout.py).
REEXPORTS = ("gradsched.lightning", "gradsched.hf", "gradsched.torch.hooks", "gradsched.torch.runtime.hooks")


def core_modules(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """Every module of ``graph`` in the planning core."""
    return tuple(sorted(m for m in graph if m != "gradsched" and not _within(m, *NOT_CORE)))


CORE = core_modules(import_graph())

# (who, what it must not import, why)
RULES = [
    (CORE, ("gradsched.commands", "gradsched.torch", "gradsched.cli"), "the planning core imports no runtime"),
    (CORE, ("gradsched.integrations",), "the planning core imports no integration"),
    (("gradsched.torch.runtime",), ("gradsched.torch.jobs", "gradsched.torch.measure", "gradsched.integrations",
                                    "gradsched.commands", "gradsched.cli"), "the runtime is below measurements and jobs"),
    (("gradsched.torch.measure",), ("gradsched.torch.jobs", "gradsched.integrations", "gradsched.commands",
                                    "gradsched.cli"), "measurements are below integrations, jobs and commands"),
    (("gradsched.integrations",), ("gradsched.torch.jobs", "gradsched.commands", "gradsched.cli"),
     "integrations sit on the runtime and measurements, below jobs and commands"),
    (("gradsched.torch",), ("gradsched.commands", "gradsched.cli"), "torch code never imports the command line"),
    (("gradsched",), ("gradsched.cli",), "only the console script enters the CLI"),
]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str, str]]:
    """(module, import, rule) for every import that breaks a rule of RULES."""
    out = set()
    for who, banned, why in RULES:
        for module, deps in graph.items():
            if not _within(module, *who) or module == "gradsched.cli" or module in REEXPORTS:
                continue
            out |= {(module, dep, why) for dep in deps if _within(dep, *banned)}
    return out


def test_the_graph_sees_deferred_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "gradsched"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import x\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from gradsched.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from gradsched.sub.a import f\n")
    graph = import_graph(tmp_path)
    assert graph["gradsched.sub"] == {"gradsched.sub.a"}
    assert graph["gradsched.sub.a"] == {"gradsched.sub.b"}
    assert graph["gradsched.sub.b"] == {"gradsched.sub.a"}
    assert find_cycle(graph) == ["gradsched.sub.a", "gradsched.sub.b", "gradsched.sub.a"]


def test_the_rules_catch_an_upward_import() -> None:
    graph = {"gradsched.torch.runtime.x": {"gradsched.torch.jobs.y", "gradsched.integrations.z"},
             "gradsched.cluster": {"gradsched.cli"}, "gradsched.integrations.z": {"gradsched.torch.jobs.y"}}
    assert {(m, d) for m, d, _ in upward_imports(graph)} == {
        ("gradsched.torch.runtime.x", "gradsched.torch.jobs.y"), ("gradsched.cluster", "gradsched.cli"),
        ("gradsched.torch.runtime.x", "gradsched.integrations.z"), ("gradsched.integrations.z", "gradsched.torch.jobs.y")}


def test_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_import_runs_up_a_layer() -> None:
    found = upward_imports(import_graph())
    new = sorted((m, d, why) for m, d, why in found if (m, d) not in KNOWN_UPWARD)
    assert not new, "\n".join(f"{m} imports {d}: {why}" for m, d, why in new)


@pytest.mark.parametrize("module, dep", sorted(KNOWN_UPWARD))
def test_known_exceptions_are_still_needed(module: str, dep: str) -> None:
    assert dep in import_graph()[module], f"{module} no longer imports {dep}: drop it from KNOWN_UPWARD"


def test_the_core_is_everything_outside_torch_the_integrations_and_the_cli() -> None:
    graph = {m: set() for m in ("gradsched", "gradsched.costs", "gradsched.sim.engine", "gradsched.torch.runtime.x",
                                "gradsched.lightning", "gradsched.integrations.hooks", "gradsched.commands.bench",
                                "gradsched.cli", "gradsched.newthing")}
    assert core_modules(graph) == ("gradsched.costs", "gradsched.newthing", "gradsched.sim.engine")
    assert {"gradsched.advise", "gradsched.costs", "gradsched.topology", "gradsched.replayable",
            "gradsched.netbench_args"} <= set(CORE)


def test_the_torch_package_has_its_three_rooms() -> None:
    graph = import_graph()
    for room in ("runtime", "measure", "jobs"):
        assert f"gradsched.torch.{room}" in graph
    flat = [m for m in graph if m.count(".") == 2 and m.startswith("gradsched.torch.")]
    stray = sorted(set(flat) - {"gradsched.torch.jobs", "gradsched.torch.measure", "gradsched.torch.runtime",
                                *REEXPORTS})
    assert not stray, (f"{', '.join(stray)} sit(s) directly in gradsched/torch/: move each into runtime/ (runs inside "
                       "a step), measure/ (feeds the planner) or jobs/ (whole processes)")
