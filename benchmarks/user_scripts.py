"""User-style scripts under their launchers, with gradsched and with stock PyTorch: equal parameters? step time?

    python benchmarks/user_scripts.py [--steps 30] [--rows cnn,transformer,...]

Each row runs one script twice on 2 CPU processes (gloo, one compute thread each), once
with gradsched and once without, the way its users launch it, and compares rank 0's final
parameters (largest relative difference of the concatenated parameters, as the runtime
tests measure it) and the median step time after 3 warm-up steps:

| row | script | launcher | gradsched | stock |
|---|---|---|---|---|
| cnn, transformer, tied_lm | benchmarks/user_scripts/loop.py | torchrun | gradsched's DistributedDataParallel (default plan) + DistributedOptimizer | torch DDP |
| hf_trainer (GPT-2) | examples/hf_trainer.py | torchrun | advised ddp_bucket_cap_mb + gradsched's all-reduce hook | the plain Trainer |
| lightning | benchmarks/user_scripts/lightning_fit.py | torchrun | GradschedStrategy("auto") | strategy="ddp" |
| accelerate (GPT-2) | examples/accelerate_train.py | accelerate launch --multi_gpu | advised bucket_cap_mb + gradsched's all-reduce hook | plain Accelerate |

Where gradsched's default plan fails on a model (it did on nn.MultiheadAttention under a
plan that overlaps the next forward, before the first-use gate, issue 38 item 1), the
row records the failure's last error line and runs again with a plan that does not
overlap (mgwfbp).  The step times come from one run each on a shared 2-core machine: a
ratio, not a result on its own (each row records its date and load average).  Writes
benchmarks/results/user_scripts.json; with ``--rows`` the rows run replace those of the
same name there and the others are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FALLBACK_PLAN = "mgwfbp"  # does not overlap the update with the next forward
WARMUP = 3
EQUAL = 1e-5  # the runtime tests' tolerance


def _port() -> str:
    from gradsched.torch.jobs.launch import free_port

    return str(free_port())


def _torchrun(script: str, *args: str) -> list[str]:
    return [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", _port(), script, *args]


def _accelerate(script: str, *args: str) -> list[str]:
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", _port(),
            script, *args]


def rows(steps: int) -> dict[str, tuple]:
    """Row name -> (command with gradsched, command without, the gradsched command with the fallback plan or None)."""
    loop = "benchmarks/user_scripts/loop.py"
    n = str(steps)
    out: dict[str, tuple] = {}
    for model in ("cnn", "transformer", "tied_lm"):
        common = ["--model", model, "--steps", n]
        out[model] = (_torchrun(loop, *common, "--mode", "gradsched"), _torchrun(loop, *common, "--mode", "torch"),
                      _torchrun(loop, *common, "--mode", "gradsched", "--plan", FALLBACK_PLAN))
    out["hf_trainer"] = (_torchrun("examples/hf_trainer.py", "--steps", n, "--advise", "--hook", "allreduce"),
                         _torchrun("examples/hf_trainer.py", "--steps", n, "--reference"), None)
    out["lightning"] = (_torchrun("benchmarks/user_scripts/lightning_fit.py", "--steps", n, "--mode", "gradsched"),
                        _torchrun("benchmarks/user_scripts/lightning_fit.py", "--steps", n, "--mode", "torch"), None)
    out["accelerate"] = (_accelerate("examples/accelerate_train.py", "--steps", n, "--advise", "--hook", "allreduce"),
                         _accelerate("examples/accelerate_train.py", "--steps", n, "--reference"), None)
    return out


def run(argv: list[str], out: Path, timeout_s: float) -> tuple[dict | None, str]:
    """Run one script (it saves to ``out``); (what it saved, or None; its last error line)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([*argv, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:g} s"
    if proc.returncode != 0 or not out.exists():
        text = proc.stdout + proc.stderr
        errors = [ln.strip() for ln in text.splitlines() if "Error" in ln and "ChildFailedError" not in ln]
        return None, (errors[-1] if errors else f"exit status {proc.returncode}")[:300]
    import torch

    return torch.load(out), ""


def compare(name: str, commands: tuple, tmp: Path, timeout_s: float) -> dict:
    """One row: both runs, the fallback where the gradsched run failed, and the figures."""
    import torch

    from gradsched.torch.jobs.selftest import rel_diff

    ours_cmd, stock_cmd, fallback = commands
    ours, error = run(ours_cmd, tmp / f"{name}-g.pt", timeout_s)
    row: dict = {"row": name, "gradsched_command": " ".join(ours_cmd).replace(str(BIN) + "/", ""),
                 "default_failed": error or None}
    if ours is None and fallback is not None:
        ours, error = run(fallback, tmp / f"{name}-f.pt", timeout_s)
        row["gradsched_command"] = " ".join(fallback).replace(str(BIN) + "/", "")
    stock, stock_error = run(stock_cmd, tmp / f"{name}-t.pt", timeout_s)
    row["stock_command"] = " ".join(stock_cmd).replace(str(BIN) + "/", "")
    if ours is None or stock is None:
        return {**row, "error": error or stock_error}
    keys = sorted(stock["params"])
    diff = rel_diff([ours["params"][k] for k in keys], [stock["params"][k] for k in keys])
    g, t = statistics.median(ours["step_s"][WARMUP:]), statistics.median(stock["step_s"][WARMUP:])
    return {**row, "plan": ours.get("plan", "advised buckets + gradsched hook"), "rel_diff": diff,
            "equal": diff <= EQUAL, "step_ms_gradsched": g * 1e3, "step_ms_stock": t * 1e3, "ratio": g / t,
            "steps": len(stock["step_s"]), "torch": torch.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", default=None, help="comma-separated subset of: cnn, transformer, tied_lm, hf_trainer, "
                                                 "lightning, accelerate")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "user_scripts.json"))
    args = ap.parse_args()
    table = rows(args.steps)
    names = args.rows.split(",") if args.rows else list(table)
    results = []
    print(f"{'row':<12} {'plan':<44} {'rel diff':>9} {'equal':>5} {'gradsched ms':>12} {'stock ms':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            r = compare(name, table[name], Path(tmp), args.timeout_s)
            results.append(r)
            if "error" in r:
                print(f"{name:<12} failed: {r['error']}", flush=True)
                continue
            plan = r["plan"] + (" (default failed)" if r["default_failed"] else "")
            print(f"{name:<12} {plan[:44]:<44} {r['rel_diff']:>9.1e} {'yes' if r['equal'] else 'no':>5} "
                  f"{r['step_ms_gradsched']:>12.1f} {r['step_ms_stock']:>9.1f} {r['ratio']:>6.2f}", flush=True)
            if r["default_failed"]:
                print(f"{'':<12} default plan: {r['default_failed'][:110]}", flush=True)
    write(Path(args.json), results, args.steps, partial=bool(args.rows))
    print(f"wrote {args.json}")
    return 0


def write(path: Path, results: list[dict], steps: int, partial: bool) -> None:
    """The result file: ``results`` (each with its date and load average); where only some rows ran
    (``partial``), the other rows of an existing file are kept, in their order."""
    stamp = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": os.getloadavg()}
    results = [{**r, **stamp} for r in results]
    command = "python benchmarks/user_scripts.py" + (f" --steps {steps}" if steps != 30 else "")
    record = {"command": command, **stamp, "warmup_steps": WARMUP, "equal_within": EQUAL, "rows": results}
    if partial and path.exists():
        record = json.loads(path.read_text())
        new = {r["row"]: r for r in results}
        old = record.get("rows", [])
        record["rows"] = [new.pop(r["row"], r) for r in old] + list(new.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
