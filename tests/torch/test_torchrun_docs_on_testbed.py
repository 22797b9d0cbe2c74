"""Issue 38 item 5: docs/torchrun.md's two-host command, verbatim, in two testbed hosts.

The command is read from the doc itself (only ``HOST0``, the step count and the
checkpoint's path are filled in), run with ``ip netns exec`` in each host, with no
``GLOO_SOCKET_IFNAME``, ``--local-addr`` or ``is_host``: the testbed gives each host what a
machine of its own has (its hostname resolves to its own address), so torchrun's c10d
rendezvous and gloo find the hosts as on separate machines.  Root only; prefix ``dt``."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gradsched.cli import main  # noqa: E402
from gradsched.testbed import Testbed, read_status  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "torchrun.md"
PREFIX = "dt"

root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="needs root and iproute2 (ip, tc): the testbed creates network namespaces",
)


def documented_two_host_command() -> list[str]:
    """The doc's first ``torchrun --nnodes 2 --nproc-per-node 1`` command, its continuation lines joined."""
    text = DOC.read_text()
    match = re.search(r"^ {4}(torchrun --nnodes 2 --nproc-per-node 1 .*?\\\n(?: {8}.*\n)*)", text, re.M)
    assert match, "docs/torchrun.md lost its two-host command"
    return shlex.split(match.group(1).replace("\\\n", " "))


def test_the_documented_command_is_the_one_this_test_runs():
    argv = documented_two_host_command()
    assert argv[:5] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "1"]
    assert "--rdzv-endpoint" in argv and "HOST0:29500" in argv and "examples/train.py" in argv
    assert not any(a.startswith(("--local-addr", "is_host")) for a in argv)  # nothing testbed-specific


def _filled(argv: list[str], host0: str, steps: int, checkpoint: Path) -> list[str]:
    out = [a.replace("HOST0", host0) for a in argv]
    out[out.index("--steps") + 1] = str(steps)
    out[out.index("--checkpoint") + 1] = str(checkpoint)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, *out[1:]]


@root
@pytest.mark.root
@pytest.mark.slow
def test_the_documented_two_host_command_runs_verbatim_in_the_testbed(tmp_path, capsys):
    assert main(["testbed", "up", "--prefix", PREFIX, "--hosts", "2", "--rate", "1gbit"]) == 0
    try:
        printed = capsys.readouterr().out
        # every hint carries the prefix: the user's testbed, not the default one
        assert f"gradsched testbed down --prefix {PREFIX}" in printed
        assert f"gradsched testbed status --prefix {PREFIX}" in printed
        assert f"ip netns exec {PREFIX}-hI" in printed
        tb = Testbed(hosts=2, prefix=PREFIX)
        argv = _filled(documented_two_host_command(), tb.addresses[0], 4, tmp_path / "ckpt.pt")
        env = {k: x for k, x in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")}
        env["OMP_NUM_THREADS"] = "1"
        procs = [subprocess.Popen(["ip", "netns", "exec", tb.namespace(i), *argv], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
                 for i in range(2)]
        outs = []
        try:
            outs = [p.communicate(timeout=300)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
        for p, out in zip(procs, outs):
            assert p.returncode == 0, out[-4000:]
        assert "2 ranks" in outs[0] and "step 4/4" in outs[0], outs[0][-2000:]
        assert (tmp_path / "ckpt.pt").exists()
    finally:
        assert main(["testbed", "down", "--prefix", PREFIX]) == 0
    assert not read_status(PREFIX).hosts
