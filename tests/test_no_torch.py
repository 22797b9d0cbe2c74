"""The planning core (formats, cost models, planners, simulator, simulate command) imports no torch,
and `bench --replay` refuses a bad profile before importing it."""

import subprocess
import sys

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
"""

CODE = BLOCK_TORCH + """
import gradsched, gradsched.planners, gradsched.sim, gradsched.cli, gradsched.timeline, gradsched.synthetic
import gradsched.calibration, gradsched.tuning
from gradsched.planners import make_plan, strategy_names
from gradsched.sim import simulate
p = gradsched.synthetic.synthetic_profile(50)
c = gradsched.Cluster.alpha_beta(1e-4, 1e-9, 8)
for name in strategy_names():
    opts = {"density": 0.01} if name in ("topk", "omgs") else {}
    simulate(make_plan(name, p, c, **opts), p, c)
gradsched.cli.build_parser()
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
print("ok")
"""


def test_core_imports_without_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


BLOCKED_CLI = BLOCK_TORCH + """
from gradsched.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_bad_replay_profile_is_refused_before_torch_is_imported(tmp_path):
    """`bench --replay` reads and checks the profile in the command's process, torch-free (gradsched.replayable)."""
    bad = tmp_path / "bad.profile.json"
    bad.write_text('{"format": "gradsched.profile/1", "model": "x", "tensors": [{"name": "a", "numel": 3, '
                   '"bytes": 3, "forward_s": 0.1, "backward_s": 0.1}]}')
    for source, words in ((str(bad), "1-byte elements"), ("no-such-profile", "bundled")):
        out = subprocess.run([sys.executable, "-c", BLOCKED_CLI, "bench", "--replay", source, "--loopback"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "torch" not in out.stderr
