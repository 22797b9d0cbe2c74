"""The bench's lines per phase: wall seconds, peak memory, start-up against the rounds."""

from gradsched.bench_memory import phase_lines


def test_a_line_per_phase_and_the_start_up_without_the_rounds():
    phases = [{"phase": "profiling", "s": 10.0, "peak_rss_bytes": 400_000_000},
              {"phase": "network table", "s": 5.5, "peak_rss_bytes": 450_000_000},
              {"phase": "rounds", "s": 100.0, "peak_rss_bytes": 720_000_000}]
    first, second = phase_lines(phases, 53_500_000)
    assert "profiling 10.0 s (0.40 GB), network table 5.5 s (0.45 GB), rounds 100.0 s (0.72 GB)" in first
    assert second.startswith("start-up 15.5 s; peak memory per rank 0.72 GB") and "0.66 GB for 3x" in second
    assert phase_lines(None, 1) == [] and phase_lines([], 1) == []


def test_run_time_autos_warm_up_is_its_own_phase_not_start_up():
    phases = [{"phase": "profiling", "s": 10.0, "peak_rss_bytes": 400_000_000},
              {"phase": "rows (built, primed)", "s": 5.0, "peak_rss_bytes": 450_000_000},
              {"phase": "auto warm-up", "s": 130.0, "peak_rss_bytes": 450_000_000},
              {"phase": "rounds", "s": 100.0, "peak_rss_bytes": 720_000_000}]
    first, second = phase_lines(phases, None)
    assert "auto warm-up 130.0 s" in first
    assert second.startswith("start-up 15.0 s without run-time auto's warm-up (130.0 s, its own phase);")
    phases[2]["s"] = 0.0  # auto planned at start-up: nothing apart
    assert phase_lines(phases, None)[1].startswith("start-up 15.0 s; peak memory")
