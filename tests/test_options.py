"""One way of checking options (gradsched.options.Option): planners, the runtime's sparse options,
the DDP comm hooks' state and the command line's --density read the same declarations."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradsched.errors import GradschedError
from gradsched.options import Option, check, check_all
from gradsched.planners import make_plan
from gradsched.planners.registry import check_options, planner_option_specs
from gradsched.sparsity import DENSITY

WORDS = Option("mode", str, "a", choices=("a", "b"))
CAP = Option("cap", float, 1.0, low=0, low_open=True, allow_inf=True, why="a cap of nothing sends nothing")


def test_check_all_fills_defaults_and_refuses_unknown_names_in_one_line():
    assert check_all("thing", (WORDS, CAP), {"cap": "inf"}) == {"mode": "a", "cap": math.inf}
    with pytest.raises(GradschedError, match=r"^unknown knob\(s\) colour; known: cap, mode$"):
        check_all("thing", (WORDS, CAP), {"colour": 1}, what="knob")


@pytest.mark.parametrize("option, value, message", [
    (WORDS, "c", "thing must be one of a, b, got 'c'"),
    (CAP, 0, "thing must be above 0 (a cap of nothing sends nothing), got 0"),
    (CAP, float("nan"), "thing must be a number, not NaN, got nan"),
    (DENSITY, float("inf"), "thing must be a finite number, got inf"),
    (DENSITY, 1.5, "thing must be at most 1, got 1.5"),
])
def test_bad_values_are_one_line_naming_the_rule(option, value, message):
    with pytest.raises(GradschedError) as err:
        check("thing", option, value)
    assert str(err.value) == message and "\n" not in str(err.value)


def test_the_planners_density_is_the_one_declaration():
    for name in ("topk", "omgs", "auto"):
        spec = planner_option_specs(name)["density"]
        assert (spec.low, spec.high, spec.low_open, spec.kind) == (DENSITY.low, DENSITY.high, True, float)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, 1.0, 1e-9, -0.0, 1.0000001])))
def test_planner_and_command_line_accept_the_same_densities(density):
    from gradsched.commands.bench import entries

    def accepted(f) -> bool:
        try:
            f()
        except GradschedError:
            return False
        return True

    want = 0 < density <= 1
    assert accepted(lambda: check("--density", DENSITY, density)) is want
    assert accepted(lambda: entries("topk", "none", density=density)) is want
    assert accepted(lambda: check_options("topk", {"density": density})) is want


def test_the_old_import_path_still_works():
    from gradsched.planners.options import Option as Old, coerce

    assert Old is Option and coerce("s", DENSITY, "0.5", list) == 0.5
    assert make_plan  # the planners import through it


@pytest.mark.parametrize("command", [["bench", "--loopback", "--no-probe"], ["train", "--workers", "2"]])
@pytest.mark.parametrize("value", ["0", "inf", "1e9"])
def test_timeout_flags_check_as_the_runtime_does(command, value, capsys):
    """bench's and train's --timeout-s and the runtime's timeout_s read one declaration (_validate.TIMEOUT_S)."""
    from gradsched._validate import timeout_s
    from gradsched.cli import main

    with pytest.raises(GradschedError) as runtime:
        timeout_s(float(value))
    assert main([*command, "--timeout-s", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(runtime.value).replace("timeout_s", "--timeout-s", 1) in err[0], err


# --------------------------------------------------------------------------- run-time auto's settings
HALF_OPEN = Option("share", float, 0.5, low=0, high=1, high_open=True)


def test_a_half_open_range_refuses_its_upper_bound_and_says_so():
    assert check("thing", HALF_OPEN, "0.99") == 0.99
    with pytest.raises(GradschedError, match=r"^thing must be below 1, got 1$"):
        check("thing", HALF_OPEN, 1)
    with pytest.raises(GradschedError, match=r"^thing must be at least 0 and below 1, got -0.5$"):
        check("thing", HALF_OPEN, -0.5)
    assert HALF_OPEN.describe() == "share (float in [0, 1), default 0.5)"


def test_every_auto_setting_is_declared_with_the_configs_default():
    from dataclasses import MISSING, fields

    from gradsched.tuning.config import OPTIONS, AutoTuneConfig

    declared = {o.name: o.default for o in OPTIONS}
    own = {f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
           for f in fields(AutoTuneConfig) if f.name != "planner_options"}
    assert declared == own
    assert AutoTuneConfig.from_options({}) == AutoTuneConfig()


def _bad_value(option: Option) -> object:
    """A value ``option``'s declaration refuses."""
    if option.kind in (bool, dict):
        return "maybe"
    if option.high is not None:
        return option.high + (0 if option.high_open else 1)
    return (option.low or 0) - 1


def _auto_options() -> list[Option]:
    from gradsched.tuning.config import OPTIONS

    return [o for o in OPTIONS if o.kind is not str]  # initial: a strategy name, checked by name below


@pytest.mark.parametrize("option", _auto_options(), ids=lambda o: o.name)
def test_a_bad_auto_setting_is_refused_in_one_line_naming_it(option):
    from gradsched.tuning.config import AutoTuneConfig

    with pytest.raises(GradschedError) as err:
        AutoTuneConfig.from_options({option.name: _bad_value(option)})
    assert str(err.value).startswith(f"auto: {option.name}") and "\n" not in str(err.value), err.value


def test_auto_settings_from_the_command_line_are_typed_as_declared():
    """``--opt torch_ddp=no`` reaches the config as the string 'no' (not JSON): it means False, not a truthy word."""
    from gradsched.tuning.config import AutoTuneConfig

    cfg = AutoTuneConfig.from_options({"torch_ddp": "no", "adaptive": "true", "patience": "4", "min_gain": "0.1"})
    assert (cfg.torch_ddp, cfg.adaptive, cfg.patience, cfg.min_gain) == (False, True, 4, 0.1)
    with pytest.raises(GradschedError, match="^auto: patience must be a whole number, got True$"):
        AutoTuneConfig.from_options({"patience": True})
    with pytest.raises(GradschedError, match="^auto: initial_options must be a dict"):
        AutoTuneConfig.from_options({"initial_options": [1]})
