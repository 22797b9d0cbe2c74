"""When a bench's rounds stop (gradsched.jobs.rounds): the rule, torch-free, and the flags."""

from __future__ import annotations

import pytest

from gradsched.cli import main
from gradsched.jobs.rounds import StoppingRule


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
