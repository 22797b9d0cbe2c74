"""`gradsched train`'s worker configuration: typed on both sides, the same JSON between them."""

from __future__ import annotations

import json

import pytest

from gradsched.cli import build_parser
from gradsched.commands.train import _config
from gradsched.errors import InternalError
from gradsched.jobconfig import TrainConfig


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
