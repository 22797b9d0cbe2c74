import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# The README's test command (scripts/test.sh) runs the property tests on fixed seeds
# ("ci"), so that a run can be reproduced and CI does not fail on a new random draw;
# plain `pytest` explores new examples on every run ("explore").
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore")
settings.load_profile(os.environ.get("GRADSCHED_HYPOTHESIS", "explore"))

# tests/strategies.py (hypothesis strategies) is imported as a top-level module by the tests
sys.path.insert(0, str(Path(__file__).parent))


# --------------------------------------------------------------------------- pytest-xdist (scripts/test.sh: -n 2)
# scripts/test.sh runs the suite on 2 workers with `--dist loadfile`: each test file runs on one worker
# (its module-scoped fixtures, which start multi-process jobs, run once).  The files below never run
# beside each other: as root they bring up the network-namespace testbed (one set of names per
# prefix), or they assert wall-clock bounds (the profiler against real compute).  Tests whose bounds
# are CPU time, a virtual clock, or a timeout with seconds of margin (the misuse, timeout and
# subgroup tests: they pass beside two busy processes) run beside the others.
# Each holds a lock file, shared by the run's workers, from its first test to its last.
# (`--dist loadgroup` would say this with xdist_group marks, but pytest-xdist 3.8 does not group
# under pytest 9.)
SERIAL_FILES = {
    # the testbed, as root (gradsched bench/train/netbench with a rate, torchrun on hosts)
    "test_testbed.py", "test_bench.py", "test_bench_bound.py", "test_bench_sigterm.py", "test_paper_testbed.py",
    "test_hier_allreduce_bench.py", "test_trace_network_bench.py", "test_byte_scaling.py", "test_cli_policy.py",
    "test_bad_input.py", "test_fit.py", "test_workdir_private.py", "test_netbench.py", "test_example_torchrun.py",
    "test_torchrun_docs_on_testbed.py", "test_bench_memory.py", "test_replay.py",
    # wall-clock bounds
    "test_profiler.py",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile``, with every file of :data:`SERIAL_FILES` in one work unit: one worker runs them
    one after another while the other runs the rest (instead of a worker waiting on the lock below)."""
    if config.getoption("dist") != "loadfile":
        return None  # another --dist: xdist's own scheduler
    from xdist.scheduler import LoadFileScheduling

    class SerialFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "serial files" if Path(path).name in SERIAL_FILES else path

    return SerialFilesTogether(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="module", autouse=True)
def _one_serial_file_at_a_time(request: pytest.FixtureRequest,
                               tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ or request.path.name not in SERIAL_FILES:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "serial-files.lock"  # the run's, shared by its workers
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def case():
    """Three tensors (two of 100 elements, one of 200) on 2 workers at alpha 0.1, beta 1e-3: the hand-made
    timelines of the simulator's tests (test_sim_timelines, test_two_phase, test_queued) are worked out on it."""
    from gradsched.cluster import Cluster
    from gradsched.profile import Profile, TensorProfile

    profile = Profile("three", (TensorProfile("t0", 100, 400, 0.1, 0.3),
                                TensorProfile("t1", 100, 400, 0.1, 0.2),
                                TensorProfile("t2", 200, 800, 0.1, 0.1)))
    return profile, Cluster.alpha_beta(0.1, 1e-3, 2)
