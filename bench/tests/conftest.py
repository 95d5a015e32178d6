"""The bench scripts' tests import the scripts as they run (`python bench/<script>.py` puts bench/ first on the
path) and the package's shared test fixtures from tests/; the package's own tests never import bench/."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "bench", ROOT / "tests"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
