"""`gradsched train`'s and `gradsched bench`'s worker configurations: typed on both sides, the same JSON between them."""

from __future__ import annotations

import json

import pytest

from gradsched.cli import build_parser
from gradsched.commands.bench import _config as bench_config
from gradsched.commands.train import _config
from gradsched.errors import InternalError
from gradsched.jobconfig import BenchConfig, TrainConfig


def test_the_command_line_builds_a_typed_config_that_round_trips_through_json(tmp_path):
    args = build_parser().parse_args(["train", "--model", "mlp", "--strategy", "ddp", "--steps", "4",
                                      "--optimizer", "adam", "--option", "bucket_cap_mb=5"])
    cfg = _config(args, str(tmp_path))
    assert isinstance(cfg, TrainConfig)
    assert (cfg.model, cfg.strategy, cfg.steps, cfg.optimizer, cfg.lr) == ("mlp", "ddp", 4, "adam", 1e-3)
    assert cfg.plan_options == {"bucket_cap_mb": 5} and cfg.out_dir == str(tmp_path)
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))  # what a worker reads
    assert again == cfg


def test_a_field_the_workers_do_not_know_is_a_bug_not_a_user_error():
    data = TrainConfig(model="mlp", strategy="sync", steps=1, batch_size=2, optimizer="sgd", lr=0.1, seed=0,
                       timeout_s=10.0, out_dir="/tmp").to_dict()
    with pytest.raises(InternalError, match="stepz"):
        TrainConfig.from_dict({**data, "stepz": 3})


# ----------------------------------------------------------------------------- gradsched bench
def _bench_config(tmp_path) -> BenchConfig:
    args = build_parser().parse_args(["bench", "--model", "mlp", "--loopback", "--strategies", "wfbp,auto",
                                      "--ddp-buckets", "none", "--steps", "2", "--rounds", "3", "-q"])
    return bench_config(args, str(tmp_path), [], args.model)


def test_bench_builds_a_typed_config_that_round_trips_through_json(tmp_path):
    cfg = _bench_config(tmp_path)
    assert isinstance(cfg, BenchConfig)
    assert (cfg.model, cfg.steps, cfg.rounds, cfg.warmup_rounds, cfg.progress) == ("mlp", 2, 3, 1, False)
    assert [e["label"] for e in cfg.entries] == ["wfbp", "auto"] and cfg.out_dir == str(tmp_path)
    data = json.loads(json.dumps(cfg.to_dict()))  # config.json, as a worker reads it
    assert list(data) == ["model", "seed", "batch_size", "lr", "entries", "steps", "rounds", "warmup_rounds",
                          "profile_iterations", "net_reps", "probe", "probe_s", "resample_share", "contention_history",
                          "timeout_s", "progress", "out_dir", "backend", "threads",
                          "dilate", "scale_bytes", "round_tol", "min_rounds",
                          "warmup_steps", "label", "budget"]  # the keys before, the two scales, the rounds, the warm-up
    # round's steps, the progress bar's name for the model, what the budget may cut (empty: on loopback, none)
    # the workers see, and when the rounds may stop early (gradsched.jobs.rounds)
    assert BenchConfig.from_dict(data) == cfg and cfg.budget == {}


def test_a_bench_field_the_workers_do_not_know_is_refused(tmp_path):
    data = _bench_config(tmp_path).to_dict()
    with pytest.raises(InternalError, match="bench config: unknown field.*stepz"):
        BenchConfig.from_dict({**data, "stepz": 3})


def test_a_bench_field_left_out_is_refused_not_defaulted(tmp_path):
    data = _bench_config(tmp_path).to_dict()
    del data["resample_share"]
    with pytest.raises(InternalError, match="bench config: missing field.*resample_share"):
        BenchConfig.from_dict(data)


def test_bench_entries_are_typed_and_read_back_field_by_field(tmp_path):
    """An entry crosses to the workers as a JSON object: a dataclass on both sides, a misspelt field refused
    where it is read (before, entries were plain dicts: any key passed, and a missing one failed mid-job)."""
    from gradsched.jobs.config import BenchEntry

    args = build_parser().parse_args(["bench", "--model", "mlp", "--loopback", "--strategies", "wfbp,topk",
                                      "--density", "0.01", "--ddp-buckets", "5", "-q"])
    cfg = bench_config(args, str(tmp_path), [], args.model)
    assert all(isinstance(e, BenchEntry) for e in cfg.entries)
    by = {e.label: e for e in cfg.entries}
    assert by["ddp-5mb"].ddp_kwargs == {"bucket_cap_mb": 5.0} and by["topk"].options == {"density": 0.01}
    assert by["wfbp"].options is None and by["ddp"]["torch_ddp"] and "ddp_kwargs" not in by["ddp"]  # as before
    written = {e["label"]: e for e in json.loads(json.dumps(cfg.to_dict()))["entries"]}
    assert written["wfbp"] == {"label": "wfbp", "strategy": "wfbp", "torch_ddp": False}  # as before: no nulls
    with pytest.raises(InternalError, match="bench entry config: unknown field.*ddp_kwarg"):
        BenchEntry.from_dict({**written["wfbp"], "ddp_kwarg": {"bucket_cap_mb": 1}})
    with pytest.raises(InternalError, match="bench entry config: missing field.*torch_ddp"):
        BenchEntry.from_dict({"label": "x", "strategy": "x"})
