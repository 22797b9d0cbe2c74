"""The bundled GoogLeNet profile and 10GbE clusters (B-Caffe logs, scripts/convert_bcaffe.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gradsched import Cluster, GradschedError, Profile
from gradsched.bundled import (bundled_cluster, bundled_profile, cluster_names, cluster_world_sizes,
                               profile_names)
from scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "tests" / "data" / "bcaffe-googlenet"
PACKAGED = ROOT / "src" / "gradsched" / "data"
KIB = 1024


@pytest.fixture(scope="module")
def convert():
    """scripts/convert_bcaffe.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("convert_bcaffe", ROOT / "scripts" / "convert_bcaffe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["convert_bcaffe"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("convert_bcaffe", None)


def _osu_us(world_size: int) -> dict[int, float]:
    """size_bytes -> avg_latency_us straight from the raw OSU log (independent of the converter)."""
    out = {}
    for line in (RAW / f"allreduce{world_size}.log").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            size, lat = line.split()
            out[int(size.split(",")[-1])] = float(lat)
    return out


def test_names_listed():
    assert profile_names() == ["googlenet", "googlenet-k80"]
    assert cluster_names() == ["googlenet-10gbe", "googlenet-intrain"]
    assert cluster_world_sizes("googlenet-10gbe") == [2, 4, 8]
    assert cluster_world_sizes("googlenet-intrain") == [2, 4, 8]


def test_profile_matches_log_sizes():
    p = bundled_profile()
    assert isinstance(p, Profile)
    assert p.num_tensors == 128
    assert p.total_numel == 13_379_136
    assert p.total_bytes == 4 * 13_379_136
    assert [t.name for t in p.tensors[:2]] == ["conv1/7x7_s2.weight", "conv1/7x7_s2.bias"]
    assert p.tensors[-2].name == "loss3/classifier.weight" and p.tensors[-2].numel == 1_024_000
    # Layer rule: the weight carries the layer's time, the bias 0 -> 64 layers, bias ready with weight.
    assert all(t.backward_s == 0 and t.forward_s == 0 for t in p.tensors[1::2])
    assert all(t.backward_s > 0 for t in p.tensors[0::2])
    assert len(set(p.layer_of)) == 64
    assert all(p.ready_s[i] == p.ready_s[i + 1] for i in range(0, 128, 2))
    assert p.order[0] in (126, 127)  # backward starts at the classifier


def test_profile_times_follow_the_readme():
    p = bundled_profile()
    assert p.tensors[0].backward_s == pytest.approx(14744.1e-6)  # first record of tmpcomm.log
    assert p.backward_s == pytest.approx(0.2015, abs=1e-4)  # summed once per layer
    assert p.compute_s == pytest.approx(64 / 163.36, rel=1e-9)  # one-node iteration
    assert p.forward_s == pytest.approx(0.5 * p.backward_s)  # the documented assumption
    assert p.other_s > 0
    assert max(p.ready_s) == pytest.approx(p.backward_s)


def test_round_trip_through_json():
    p = bundled_profile()
    assert Profile.from_dict(json.loads(json.dumps(p.to_dict()))).to_dict() == p.to_dict()
    c = bundled_cluster(world_size=4)
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))).to_dict() == c.to_dict()


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_cluster_reproduces_osu_table_exactly(world_size):
    c = bundled_cluster("googlenet-10gbe", world_size)
    assert c.world_size == world_size
    cost = c.cost("allreduce")
    table = _osu_us(world_size)
    assert len(table) == len(cost.points) >= 260
    for size, lat_us in table.items():
        assert cost.time_s(size) == pytest.approx(lat_us * 1e-6, rel=1e-12), size


@pytest.mark.parametrize("world_size", [4, 8])
def test_protocol_switch_visible(world_size):
    cost = bundled_cluster("googlenet-10gbe", world_size).cost("allreduce")
    assert cost.time_s(12 * KIB) > 2.5 * cost.time_s(8 * KIB)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_fitted_line_predicts_large_messages(world_size):
    cost = bundled_cluster("googlenet-10gbe", world_size).cost("allreduce")
    line_1mib = cost.alpha_s + cost.beta_s_per_byte * (1 << 20)
    assert line_1mib == pytest.approx(_osu_us(world_size)[1 << 20] * 1e-6, rel=0.10)
    # Beyond the table the line takes over, continuous within that 10% and increasing.
    above = cost.time_s((1 << 20) + 1)
    assert above == pytest.approx(cost.time_s(1 << 20), rel=0.10)
    assert cost.time_s(50e6) > cost.time_s(10e6) > above
    # Start-up of the large-message protocol: far above the eager 4-byte latency.
    assert cost.alpha_s > cost.time_s(4)


def test_costs_grow_with_world_size():
    big = 25e6
    times = [bundled_cluster(world_size=p).cost("allreduce").time_s(big) for p in (2, 4, 8)]
    assert times == sorted(times) and times[0] > 0


def test_in_training_cluster_is_slower_and_matches_its_total(convert):
    for p in (2, 4, 8):
        intrain = bundled_cluster("googlenet-intrain", p).cost("allreduce")
        osu = bundled_cluster("googlenet-10gbe", p).cost("allreduce")
        assert intrain.points is None
        assert intrain.time_s(4_096_000) > osu.time_s(4_096_000)
        # OLS with an intercept: the line reproduces the measured total in-training time.
        pairs = convert.in_training_pairs(convert.read_records(RAW / f"tmp{p}comm.log"))
        assert sum(intrain.time_s(b) for b, _ in pairs) == pytest.approx(sum(t for _, t in pairs), rel=1e-6)


def test_default_and_extrapolated_world_sizes():
    assert bundled_cluster().world_size == 8
    c16 = bundled_cluster(world_size=16)
    assert c16.world_size == 16
    assert c16.cost("allreduce").time_s(50e6) > bundled_cluster(world_size=8).cost("allreduce").time_s(50e6)
    assert bundled_cluster(world_size=3).world_size == 3
    assert bundled_cluster(world_size=1).cost("allreduce").time_s(1e6) == 0


def test_unknown_names_are_user_errors():
    with pytest.raises(GradschedError, match="googlenet-10gbe"):
        bundled_cluster("resnet-1gbe")
    with pytest.raises(GradschedError, match="googlenet"):
        bundled_profile("resnet50")
    with pytest.raises(GradschedError, match="positive integer"):
        bundled_cluster(world_size=0)


def test_converter_reproduces_packaged_files(convert, tmp_path):
    written = convert.convert(RAW, tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in PACKAGED.glob("*.json"))
    for path in written:
        assert path.read_text() == (PACKAGED / path.name).read_text(), path.name
    assert convert.check(RAW, PACKAGED) == []


def test_converter_check_detects_drift(convert, tmp_path):
    convert.convert(RAW, tmp_path)
    victim = tmp_path / "googlenet-10gbe.p8.cluster.json"
    victim.write_text(victim.read_text().replace('"mpi"', '"nccl"'))
    assert convert.check(RAW, tmp_path) == ["googlenet-10gbe.p8.cluster.json"]
    assert convert.main([str(RAW), "--out", str(tmp_path), "--check"]) == 1


def test_converter_logged_bias_padding(convert):
    # Every weight has GoogLeNet's exact size; biases are logged padded to 64 elements.
    assert convert.logged_numel("inception_3a/3x3_reduce.bias", 96) == 128
    assert convert.logged_numel("loss3/classifier.bias", 1000) == 1024
    assert convert.logged_numel("inception_3a/3x3_reduce.weight", 18432) == 18432
    assert sum(n for _, n in convert.googlenet_tensors()) == 13_379_136 - 856


def test_converter_rejects_bad_logs(convert, tmp_path):
    bad = tmp_path / "tmpcomm.log"
    bad.write_text("I0207 distributed.cpp:112] [0, 9408, 1.0, 2.0]\n")
    with pytest.raises(GradschedError, match="need the last 128"):
        convert.read_records(bad)
    osu = tmp_path / "allreduce8.log"
    osu.write_text("# OSU\n4,4   1.0\n4,8   2.0\n")
    with pytest.raises(GradschedError, match="measured on 4 nodes"):
        convert.read_osu(osu, 8)


def test_packaged_data_declared_for_the_wheel():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'gradsched = ["data/*.json"]' in text


def test_mgwfbp_benchmark_ranks_strategies():
    """benchmarks/mgwfbp_googlenet.py on the 8-node OSU cluster: merging never loses."""
    bench = load_script("benchmarks/mgwfbp_googlenet.py", "mgwfbp_googlenet")
    if bench.missing_parts():
        pytest.skip(f"needs {bench.missing_parts()}")
    for variant in bench.PROFILES:
        res = bench.run(["googlenet-10gbe"], [8], variant)
        rows = res["clusters"]["googlenet-10gbe"]["8"]
        it = {s: rows[s]["iteration_s"] for s in bench.STRATEGIES}
        eps = 1e-9
        assert all(t >= res["compute_s"] - eps for t in it.values())
        assert it["mgwfbp"] <= min(it["wfbp"], it["sync"]) + eps
        assert it["optimal"] <= it["mgwfbp"] + eps
        assert it["sync"] > res["compute_s"] + 0.05  # one 53.5 MB all-reduce cannot hide at 8 nodes
        assert rows["wfbp"]["operations"] == 128 and rows["sync"]["operations"] == 1
