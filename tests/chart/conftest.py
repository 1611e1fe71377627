"""Fixtures for the chart tests: a helm binary and a cached renderer of charts/slime."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.framework.chart import CRD_APIS, NAMESPACE, RELEASE, YAML_LOADER, run_helm
from testbed.framework.helm import HelmUnavailable, helm_binary
from testbed.framework.paths import CHART
from testbed.framework.pins import KUBE_VERSION


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_binary()
    except HelmUnavailable as exc:  # make the cause obvious rather than a cascade of errors
        pytest.fail(f"helm is required for the chart tests: {exc}")


@pytest.fixture(scope="session")
def render(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict[str, Any]]]:
    """render(values=None, *extra_args, api_versions=CRD_APIS) -> list of rendered objects."""
    tmp_dir = tmp_path_factory.mktemp("helm-values")
    cache: dict[str, list[dict[str, Any]]] = {}

    def _render(
        values: dict[str, Any] | None = None, *extra: str, api_versions: tuple[str, ...] = CRD_APIS
    ) -> list[dict[str, Any]]:
        key = json.dumps([values, extra, api_versions], sort_keys=True)
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
            for api in api_versions:
                args += ["--api-versions", api]
            out = run_helm(helm, args + list(extra), tmp_dir, values)
            cache[key] = [d for d in yaml.load_all(out, Loader=YAML_LOADER) if d]
        return cache[key]

    return _render


@pytest.fixture(scope="session")
def lint(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    tmp_dir = tmp_path_factory.mktemp("helm-lint")

    def _lint(values: dict[str, Any] | None = None, *extra: str) -> str:
        return run_helm(helm, ["lint", "--strict", str(CHART), "--namespace", NAMESPACE, *extra], tmp_dir, values)

    return _lint
