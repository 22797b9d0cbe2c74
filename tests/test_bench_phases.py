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
