"""Tests of the Python tools in bench/ (run from the repository root):

    python3 -m unittest discover -s tests/python -t .

No GPU, nsys or PyTorch needed: the parsers are tested against recorded output in tests/fixtures/,
and the scripts against fake nvidia-smi, nsys and trainer binaries.
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
FIXTURES = REPO / "tests" / "fixtures"

# The bench tools run as `python3 bench/x.py`, with bench/ first on the import path: they import each other as
# top-level modules and what they share as the package bench/lib (`from lib import runner`).
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
