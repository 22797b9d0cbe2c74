"""benchmarks/emulate_llms.py: its settings pass the bench's own checks, and its table reads the stored runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import emulate_llms as el  # noqa: E402

from gradsched.errors import GradschedError  # noqa: E402
from gradsched.jobs.bench import shaped_rate  # noqa: E402
from gradsched.profile import Profile  # noqa: E402


@pytest.mark.parametrize("hosts", sorted(el.SETTINGS))
def test_each_host_counts_byte_scale_lets_the_links_pass_the_faithful_rate_at_its_dilation(hosts: int) -> None:
    """100 Gbit/s at the script's S and K is shaped within what the machine moves faithfully; at the same K and
    half the S the bench refuses it (so S is the least that fits at that dilation, not an arbitrary one)."""
    scale, dilate = el.SETTINGS[hosts]
    assert shaped_rate("100gbit", hosts, dilate, True, scale) == int(100e9 / dilate / scale)
    with pytest.raises(GradschedError, match="--dilate"):
        shaped_rate("100gbit", hosts, dilate, True, scale // 2)


def test_the_stored_profiles_are_the_presets_shapes_at_the_stated_throughput_and_batch() -> None:
    llama = Profile.load(el.profile_path("llama-7b"))
    gpt = Profile.load(el.profile_path("gpt2-xl"))
    assert llama.total_numel == 6_738_415_616 and gpt.total_numel == 1_557_611_200
    for model, profile in (("llama-7b", llama), ("gpt2-xl", gpt)):
        assert profile.extra["device_tflops"] == el.TFLOPS
        assert profile.extra["batch_size"] == el.PROFILES[model][1]


def test_the_command_gives_the_settings_and_no_bucket_sweep() -> None:
    cmd = el.bench_command("gpt2-xl", 8, el.parser().parse_args([]), Path("out.json"))
    flag = {k: v for k, v in zip(cmd, cmd[1:]) if k.startswith("--")}
    assert (flag["--scale-bytes"], flag["--dilate"], flag["--rate"]) == ("512", "1", "100gbit")
    assert flag["--strategies"] == "ddp,auto" and flag["--ddp-buckets"] == "none" and flag["--prefix"] == "gsm"


def test_the_table_has_a_line_per_stored_run_with_its_memory_line() -> None:
    import json

    runs = json.loads((el.RESULTS / "emulate_llms_llm12.json").read_text())["runs"]
    lines = el.table(runs)
    assert len(lines) == 1 + len(runs)
    llama = runs["llama-7b 2h"]
    assert llama["bench_pick"]["scale_bytes"] == 16 and llama["scale_bytes"] == 128
    assert "1.13" in next(line for line in lines if line.startswith("llama-7b"))  # 3 x 210.6 MB + 0.5 GB
