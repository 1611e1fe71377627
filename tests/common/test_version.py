"""Which SliMe runs: --version of every console script, the first log line, slime_build_info and /version."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from certs.devcerts import main as dev_certs
from common.metrics import WebhookMetrics
from common.serving import Readiness, health_app
from common.version import REVISION_ENV, build_info, version
from kubemu import Emulator
from testbed.framework.paths import REPO_ROOT
from testbed.framework.ports import free_port

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


def test_the_first_log_line_says_which_build(emulator: Emulator, tmp_path: Path) -> None:
    """The first JSON line a started service writes; a bad setting is still the one line of exit 2 (no JSON before)."""
    certs = tmp_path / "certs"
    dev_certs(["--out", str(certs), "--dns", "localhost"])
    args = ["--cert-file", str(certs / "tls.crt"), "--key-file", str(certs / "tls.key"), "--host", "127.0.0.1"]
    args += ["--port", str(free_port()), "--metrics-port", str(free_port())]
    args += ["--kubeconfig", emulator.write_kubeconfig(tmp_path / "kubeconfig")]
    process = subprocess.Popen(
        [sys.executable, "-m", "scaling_webhook.main", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "", REVISION_ENV: "abc", "POD_NAMESPACE": "slime-system"},
    )
    try:
        assert process.stderr is not None
        first = json.loads(process.stderr.readline())
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert (first["msg"], first["service"], first["version"], first["revision"]) == (
        "starting",
        "scaling-webhook",
        version(),
        "abc",
    )
    refused = subprocess.run(
        [sys.executable, "-m", "injection_webhook.main", "--cert-file", str(tmp_path / "none.crt")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": ""},
    )
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
