"""Issue 18 item 5: one command-line convention, pinned (docs/cli.md).

``--json [PATH]`` means the same everywhere (PATH '-' or none: stdout); ranks are
``--workers`` everywhere (old spellings kept as aliases); ``--version``;
``--log-level`` before or after the subcommand; a failed training exits with its
workers' status, bad input with 2; matplotlib is imported only for ``--plot``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

import gradsched
from gradsched.cli import _all_subparsers, build_parser, main

# Subcommands that report something: each must take --json (a test below keeps the list honest).
JSON_COMMANDS = {"simulate", "train", "compare", "bench", "testbed status", "advise", "profile", "plan", "netbench"}
# The commands the top-level help names as having no --json (issue 38 item 7: the help is exact).
NO_JSON = {"testbed up", "testbed down"}
# Subcommands that run or plan for a number of ranks: each spells it --workers.
WORKER_COMMANDS = {"simulate", "plan", "train", "bench", "netbench", "advise"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser by its full name ('testbed status')."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {p.prog.removeprefix("gradsched "): p for p in _all_subparsers(sub)}


def _option(p: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in p._actions if flag in a.option_strings), None)


def test_every_json_flag_takes_a_path_or_dash():
    parsers = _subparsers()
    with_json = {name for name, p in parsers.items() if _option(p, "--json")}
    assert with_json == JSON_COMMANDS
    for name in with_json:
        action = _option(parsers[name], "--json")
        assert action.nargs == "?" and action.const == "-" and action.default is None, name


def test_the_help_names_exactly_the_commands_without_json():
    parsers = _subparsers()
    without = {name for name, p in parsers.items() if not _option(p, "--json") and name != "testbed"}
    assert without == NO_JSON
    epilog = " ".join(build_parser().format_help().split())
    assert "in every command but testbed up and testbed down" in epilog


def test_help_texts_are_plain_text():
    """No reST markup (``x``, :func:`x`) or backticks in any --help (issue 38 item 7)."""
    parsers = {"gradsched": build_parser(), **_subparsers()}
    for name, p in parsers.items():
        text = p.format_help()
        assert "`" not in text and ":func:" not in text and ":class:" not in text, (name, text)


def test_plan_json_on_stdout_without_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--strategy", "mgwfbp", "--alpha", "1e-4", "--beta", "1e-9", "--json", "-"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["format"] == "gradsched.plan/1" and plan["strategy"] == "mgwfbp"
    assert list(tmp_path.iterdir()) == []
    assert main(["plan", "--strategy", "mgwfbp"]) == 2
    assert "-o PLAN.json" in capsys.readouterr().err
    out = tmp_path / "p.json"
    assert main(["plan", "--strategy", "mgwfbp", "-o", str(out), "--json", str(tmp_path / "copy.json")]) == 0
    assert json.loads(out.read_text()) == json.loads((tmp_path / "copy.json").read_text())


def test_ranks_are_spelled_workers_everywhere():
    parsers = _subparsers()
    for name in WORKER_COMMANDS:
        assert _option(parsers[name], "--workers") is not None, name
    # the old spellings still work, as the same flag
    assert _option(parsers["train"], "--nproc") is _option(parsers["train"], "--workers")
    assert _option(parsers["bench"], "--hosts") is _option(parsers["bench"], "--workers")
    assert _option(parsers["train"], "--option") is _option(parsers["train"], "--opt")


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"gradsched {gradsched.__version__}"


def test_log_level_before_or_after_the_subcommand(monkeypatch):
    monkeypatch.delenv("GRADSCHED_LOG_LEVEL", raising=False)
    parser = build_parser()
    assert parser.parse_args(["--log-level", "info", "simulate"]).log_level == "info"
    assert parser.parse_args(["simulate", "--log-level", "DEBUG"]).log_level == "debug"
    assert parser.parse_args(["testbed", "status", "--log-level", "info"]).log_level == "info"
    assert not hasattr(parser.parse_args(["simulate"]), "log_level")


@pytest.mark.parametrize("form", [["--json"], ["--json", "-"]])
def test_simulate_json_on_stdout(capsys, form):
    assert main(["simulate", "--strategy", "wfbp,mgwfbp", *form]) == 0
    rows = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert [r["strategy"] for r in rows] == ["wfbp", "mgwfbp"]


def test_simulate_json_to_a_path_keeps_the_report(tmp_path, capsys):
    out = tmp_path / "sub" / "sim.json"
    assert main(["simulate", "--strategy", "wfbp", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "iter ms" in printed and f"wrote {out}" in printed
    assert json.loads(out.read_text())[0]["strategy"] == "wfbp"


def test_failed_training_exits_with_the_workers_status(monkeypatch, capsys):
    from gradsched.commands import train

    monkeypatch.setattr(train, "launch", lambda cfg, nproc, **kw: (3, "RuntimeError: a worker failed\n"))
    assert main(["train", "--steps", "2", "--warmup", "0"]) == 3
    err = capsys.readouterr().err
    assert "training failed (workers exited with 3): RuntimeError: a worker failed" in err


def test_bad_input_still_exits_2(capsys):
    assert main(["train", "--steps", "0"]) == 2


def test_matplotlib_only_for_plots():
    code = ("import sys; from gradsched.cli import main; "
            "assert main(['simulate', '--strategy', 'wfbp,optimal', '--json', '-']) == 0; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported without --plot'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_plot_without_matplotlib_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    assert main(["simulate", "--strategy", "wfbp", "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'gradsched[plot]'" in capsys.readouterr().err


@pytest.mark.slow
def test_log_level_info_shows_run_time_auto_decisions(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "gradsched.cli", "train", "--strategy", "auto", "--opt", "trials=1",
                           "--steps", "8", "--warmup", "1", "--log-level", "info", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gradsched[rank 0] INFO gradsched.autotune: auto: planned" in proc.stderr
    assert json.loads(out.read_text())["strategy"] == "auto"
