"""Integrations in their own room, old paths kept, a lazy ``gradsched.torch`` (issue 37 item 3).

``lightning``, ``hf`` and the DDP comm hooks live in ``gradsched.integrations``; the old
import paths are thin re-export modules (no ``sys.modules`` alias) of the same objects;
``gradsched.torch`` imports a name on first use, so importing one module of the package
does not execute the rest of it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from test_layering import REEXPORTS  # tests/ is on the path (its conftest)

SRC = Path(__file__).resolve().parents[2] / "src"

MOVED = {"gradsched.lightning": "gradsched.integrations.lightning", "gradsched.hf": "gradsched.integrations.hf",
         "gradsched.torch.hooks": "gradsched.integrations.hooks",
         "gradsched.torch.runtime.hooks": "gradsched.integrations.hooks"}


def _source(module: str) -> Path:
    path = SRC.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_a_thin_re_export_of_its_new_module(old):
    tree = ast.parse(_source(old).read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    imports = [n for n in body if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in imports] == [MOVED[old]]
    assert all(isinstance(n, ast.ImportFrom) or (isinstance(n, ast.Assign) and n.targets[0].id == "__all__")
               for n in body), f"{old} should only re-export {MOVED[old]}"
    assert set(MOVED) == set(REEXPORTS)  # the layering test exempts exactly these


def test_no_module_aliases_itself_into_sys_modules():
    offenders = [str(p.relative_to(SRC)) for p in (SRC / "gradsched").rglob("*.py") if "sys.modules[" in p.read_text()]
    assert not offenders, offenders


@pytest.mark.parametrize("old, names", [
    ("gradsched.torch.hooks", ["TopKState", "topk_hook", "merged_topk_hook", "fp16_hook", "bf16_wrapper",
                               "allreduce_hook", "register_hook"]),
    ("gradsched.torch.runtime.hooks", ["TopKState", "topk_hook", "fp16_wrapper", "register_hook"]),
])
def test_the_old_hook_paths_give_the_same_objects(old, names):
    pytest.importorskip("torch")
    new, was = importlib.import_module(MOVED[old]), importlib.import_module(old)
    assert all(getattr(was, n) is getattr(new, n) for n in names)
    assert set(was.__all__) <= {n for n in dir(new) if not n.startswith("_")}


def test_the_old_framework_paths_give_the_same_objects():
    pytest.importorskip("torch")
    if importlib.util.find_spec("lightning") is not None:
        from gradsched.integrations.lightning import GradschedStrategy
        from gradsched.lightning import GradschedStrategy as Old

        assert Old is GradschedStrategy
    if importlib.util.find_spec("transformers") is not None:
        from gradsched.hf import add_comm_hook as old
        from gradsched.integrations.hf import add_comm_hook

        assert old is add_comm_hook


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(m for m in sys.modules if m.startswith(('gradsched', 'torch')))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_importing_one_module_of_gradsched_torch_does_not_execute_the_package():
    loaded = _loaded_after("import gradsched.torch.runtime.layout")
    ours = [m for m in loaded if m.startswith("gradsched.torch")]
    assert ours == ["gradsched.torch", "gradsched.torch.runtime", "gradsched.torch.runtime.layout"]
    assert "torch" not in loaded  # the layout module needs no torch, so nothing imported it
    assert "gradsched.integrations.hooks" not in _loaded_after("import gradsched.torch")


def test_the_facade_gives_every_public_name_on_first_use():
    pytest.importorskip("torch")
    import gradsched.torch as gt

    assert sorted(gt.__all__) == sorted(gt._EXPORTS)
    for name in gt.__all__:
        value = getattr(gt, name)
        defined = importlib.import_module(gt._EXPORTS[name])
        assert value is (defined if name == "hooks" else getattr(defined, name))
    from gradsched.torch import DistributedDataParallel, hooks  # the documented spellings

    assert DistributedDataParallel.__module__ == "gradsched.torch.runtime.wrapper"
    assert hooks.topk_hook is importlib.import_module("gradsched.integrations.hooks").topk_hook
    assert set(gt.__all__) <= set(dir(gt))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        gt.nothing_here  # noqa: B018
