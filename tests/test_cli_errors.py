"""What the command line does with an error: the user's (one line, exit 2) or gradsched's (traceback, exit 1)."""

from __future__ import annotations

import pytest

import gradsched
from gradsched import cli
from gradsched.commands import simulate
from gradsched.errors import FormatError, GradschedError, InternalError


def _run_failing(monkeypatch, capsys, exc: BaseException) -> tuple[int, str]:
    def fail(args):
        raise exc

    monkeypatch.setattr(simulate, "run", fail)  # register() reads it when the parser is built
    code = cli.main(["simulate", "--alpha", "1e-3", "--beta", "1e-9"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("exc", [GradschedError("--rate needs root: use --loopback"),
                                 FormatError("c.json", "collectives", "must be a non-empty JSON object")])
def test_a_user_error_is_one_line_and_exit_2(monkeypatch, capsys, exc):
    code, err = _run_failing(monkeypatch, capsys, exc)
    assert code == 2
    assert err.splitlines() == [f"gradsched simulate: error: {exc}"]
    assert "Traceback" not in err


@pytest.mark.parametrize("exc", [InternalError("an operation can never be issued"), KeyError("tensor"),
                                 AssertionError("ready order"), OSError(5, "input/output error")])
def test_an_internal_fault_prints_its_traceback_and_asks_for_a_report(monkeypatch, capsys, exc):
    code, err = _run_failing(monkeypatch, capsys, exc)
    assert code == 1
    assert err.startswith("Traceback (most recent call last):")
    assert type(exc).__name__ in err and "in fail" in err  # where it happened
    last = err.strip().splitlines()[-1]
    assert last.startswith("gradsched simulate: internal error") and "report" in last
    assert gradsched.__version__ in last


def test_an_internal_error_is_not_a_user_error():
    assert not issubclass(InternalError, GradschedError)


def test_every_command_module_registers():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == list(cli.COMMANDS)
