"""The method tests' shared builders (helpers.py) for the files in every sub-folder of
tests/algorithms/, which mirror src/fedshift/algorithms/ (common/ included)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
