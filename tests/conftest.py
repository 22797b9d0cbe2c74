import os
import sys
from pathlib import Path

from hypothesis import settings

# The README's test command (scripts/test.sh) runs the property tests on fixed seeds
# ("ci"), so that a run can be reproduced and CI does not fail on a new random draw;
# plain `pytest` explores new examples on every run ("explore").
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore")
settings.load_profile(os.environ.get("GRADSCHED_HYPOTHESIS", "explore"))

# tests/strategies.py (hypothesis strategies) is imported as a top-level module by the tests
sys.path.insert(0, str(Path(__file__).parent))
