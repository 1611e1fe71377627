"""Which SliMe runs: --version of every console script, the first log line, slime_build_info and /version."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from common.metrics import WebhookMetrics
from common.serving import Readiness, health_app
from common.version import REVISION_ENV, build_info, version
from testbed.helm import REPO_ROOT

SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_version_is_the_packages() -> None:
    assert version() == tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_answers_version(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module, _, function = SCRIPTS[script].partition(":")
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {function}; {function}(['--version'])"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "", REVISION_ENV: "c0ffee"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{script} {version()} (revision c0ffee)"


def test_build_info_is_exported_once_with_the_version_and_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REVISION_ENV, "deadbeef")
    text = generate_latest(WebhookMetrics().registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("slime_build_info")]
    assert lines == [f'slime_build_info{{revision="deadbeef",version="{version()}"}} 1.0']


def test_version_on_the_health_port() -> None:
    import asyncio

    import httpx

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=health_app(WebhookMetrics(), Readiness()))
        async with httpx.AsyncClient(transport=transport, base_url="http://health") as client:
            return await client.get("/version")

    answer = asyncio.run(get())
    assert answer.status_code == 200 and answer.json() == build_info()


def test_the_first_log_line_says_which_build(tmp_path: Path) -> None:
    """A service that then exits 2 on a missing certificate: its first line is still the version line."""
    proc = subprocess.run(
        [sys.executable, "-m", "injection_webhook.main", "--cert-file", str(tmp_path / "none.crt")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "", REVISION_ENV: "abc"},
    )
    assert proc.returncode == 2
    first = json.loads(proc.stderr.splitlines()[0])
    assert (first["msg"], first["service"], first["version"], first["revision"]) == (
        "starting",
        "injection-webhook",
        version(),
        "abc",
    )
