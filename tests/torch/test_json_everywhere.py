"""Issue 38 item 7: ``--json [PATH]`` in profile and netbench too (plan: tests/test_cli_policy.py): the file's
JSON on stdout with ``-`` (nothing else there), or copied to PATH."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from gradsched.cli import main  # noqa: E402


def test_profile_json_on_stdout_writes_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--model", "mlp", "--iterations", "1", "--warmup", "0", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "gradsched.profile/1" and data["model"] == "mlp"
    assert list(tmp_path.iterdir()) == []  # no profile.json beside the JSON asked for
    assert main(["profile", "--model", "mlp", "--iterations", "1", "--warmup", "0", "-q"]) == 0
    assert (tmp_path / "profile.json").exists()  # the old default without --json


NETBENCH = ["netbench", "--workers", "2", "--max-bytes", "16384", "--reps", "1", "--warmup", "0",
            "--collectives", "allreduce"]


@pytest.mark.slow
def test_netbench_json_on_stdout_is_the_cluster_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*NETBENCH, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "gradsched.cluster/1"
    assert list(tmp_path.iterdir()) == []  # no cluster.json beside the JSON asked for
    out = tmp_path / "c.json"
    assert main([*NETBENCH, "-o", str(out), "--json", "-"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) and printed["format"] == "gradsched.cluster/1"
