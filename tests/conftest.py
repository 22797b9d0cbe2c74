import sys
from pathlib import Path

# tests/strategies.py (hypothesis strategies) is imported as a top-level module by the tests
sys.path.insert(0, str(Path(__file__).parent))
