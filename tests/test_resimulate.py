"""benchmarks/resimulate.py on a committed bench run: plans as they ran, the table read again."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import resimulate  # noqa: E402

from gradsched.cluster import Cluster  # noqa: E402

RUN = ROOT / "benchmarks" / "results" / "bench_replay_googlenet_k80_8h.json"


def test_ddp_rows_are_planned_as_they_ran_and_every_row_is_predicted():
    rows = resimulate.resimulate(RUN)
    kept = json.loads(RUN.read_text())
    assert [r["strategy"] for r in rows] == [r["strategy"] for r in kept]
    for got, row in zip(rows, kept):
        assert got["measured_s"] == row["iteration_s_median"] and got["predicted_now_s"] > 0
        if row["runs"] == "torch DDP":
            assert got["operations"] == row["operations"]
            assert math.isclose(got["error_now"], (got["predicted_now_s"] - got["measured_s"]) / got["measured_s"])


def test_the_table_is_read_again_through_the_split_envelope():
    job = Cluster.from_dict(json.loads(RUN.read_text())[0]["cluster"])
    points = resimulate.reread_cluster(job).cost("allreduce").points
    for i, (size, seconds) in enumerate(points):
        for smaller, t in points[:i]:
            assert seconds <= math.ceil(size / smaller) * t * (1 + 1e-12)
