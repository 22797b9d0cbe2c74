"""When a bench's rounds stop (gradsched.jobs.rounds): the rule, torch-free, and the flags."""

from __future__ import annotations

import pytest

from gradsched.cli import main
from gradsched.jobs.rounds import RoundLoads, StoppingRule, load_1min, loaded_above


def test_the_rounds_stop_once_the_last_moved_no_median_beyond_tol():
    rule = StoppingRule(tol=0.01, min_counted=2, warmup=1)
    steady = [[5.0] * 3, [1.0, 1.0, 1.0], [1.0, 1.004, 0.998]]  # warm-up, then two counted rounds alike
    moving = [[5.0] * 3, [1.0] * 3, [1.2] * 3]  # its second counted round moves its median by 10%
    assert rule.settled([steady, steady])
    assert not rule.settled([steady, moving])  # every row must have settled
    assert rule.moves([steady, moving]) == [pytest.approx(0.1)]  # median of 1.0 x3, 1.2 x3: 1.1


def test_the_rounds_run_at_least_min_counted_and_all_of_them_at_tol_zero():
    steady = [[1.0] * 3] * 6
    assert not StoppingRule(0.01, 3, 1).settled([steady[:3]])  # two counted rounds: fewer than 3
    assert StoppingRule(0.01, 3, 1).settled([steady[:4]])
    assert not StoppingRule(0.0, 2, 1).settled([steady])  # tol 0: every round
    record = StoppingRule(0.01, 2, 1).record([steady[:3]], max_rounds=6)
    assert record["rounds_run"] == 3 and record["stopped_early"] and record["moves"] == [0.0]
    assert not StoppingRule(0.01, 2, 1).record([steady], max_rounds=6)["stopped_early"]


@pytest.mark.parametrize("flags, words", [(["--round-tol", "1.5"], "--round-tol"), (["--round-tol", "-0.1"], "--round-tol"),
                                          (["--min-rounds", "1"], "--min-rounds")])
def test_bad_stopping_flags_exit_2_with_one_line(flags, words, capsys):
    code = main(["bench", "--model", "mlp", "--loopback", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0]


def test_the_load_is_the_first_field_of_loadavg_and_none_where_there_is_none(tmp_path):
    fake = tmp_path / "loadavg"
    fake.write_text("6.83 5.10 4.02 9/812 12345\n")
    assert load_1min(str(fake)) == 6.83
    assert load_1min(str(tmp_path / "absent")) is None
    fake.write_text("")
    assert load_1min(str(fake)) is None


def test_a_round_is_loaded_above_three_quarters_of_the_ranks_and_never_at_or_below_the_cores():
    assert loaded_above(8, 2) == 6.0  # 8 emulated hosts on this machine's 2 cores
    assert loaded_above(2, 2) == 2.0 and loaded_above(4, 2) == 3.0 and loaded_above(2, 16) == 16.0


def _flagged_table(rounds: list[float]) -> str:
    from gradsched.commands.bench import table

    loads = RoundLoads(read=iter([5.0, *rounds]).__next__)
    loads.at_startup_end()
    for _ in rounds:
        loads.after_round()
    row = {"strategy": "ddp", "iteration_s_median": 0.4, "speedup_vs_ddp": 1.0, "speedup_vs_best_ddp": 1.0,
           "vs_lower_bound": 1.2, "predicted_iteration_s": 0.41, "prediction_error": 0.025, "operations": 3,
           "warmup_rounds": 1}
    return table({"rows": [row, {**row, "strategy": "ddp-1mb"}], "load": loads.record(8, 2),
                  "lower_bound": {"lower_bound_s": 0.3, "compute_s": 0.2, "allreduce_all_s": 0.3}, "best_ddp": "ddp"})


def test_the_table_flags_the_rows_whose_counted_rounds_ran_under_load():
    text = _flagged_table([9.0, 4.2, 6.8, 5.1])  # the warm-up round's 9.0 is not counted
    assert [line.endswith("+2.5%~") for line in text.splitlines()[1:3]] == [True, True]
    assert "~ 1 of 3 counted rounds ended with the 1-minute load above 6 (8 ranks on 2 cores" in text
    assert "loads 4.2, 6.8, 5.1" in text
    quiet = _flagged_table([9.0, 4.2, 5.9, 5.1])
    assert "~" not in quiet and all(line.endswith("+2.5%") for line in quiet.splitlines()[1:3])
