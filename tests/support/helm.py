"""``helm`` for the chart tests: the implementation lives in ``demo.helm`` (shared with the demo).

``python -m tests.support.helm [3]`` prints the path of a working helm (Helm 3 with ``3``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from demo.helm import CACHE_DIR, HelmUnavailable, helm3_binary, helm_binary

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["CACHE_DIR", "REPO_ROOT", "HelmUnavailable", "helm_binary", "helm3_binary"]

if __name__ == "__main__":
    print(helm3_binary() if sys.argv[1:] == ["3"] else helm_binary())
