"""Debian's Prometheus for the tiers: fetched once into the cache, run on 127.0.0.1.

**Fetching.** :func:`binaries` takes the ``prometheus`` package at the version apt offers
(``apt-cache policy``; ``apt-get update`` once, only when the lists do not know it), fetches the
``.deb`` with ``apt-get download`` and unpacks it with ``dpkg-deb -x``: nothing is installed on
the host. ``prometheus`` and ``promtool`` go to ``<cache>/prometheus-<version>/`` (the cache of
:func:`testbed.real.build.cache_root`), so later runs find them by version. Both binaries are Go
programs that need only libc. Without apt (or without root for the one ``apt-get update``)
:class:`testbed.real.debian.PackagesUnavailable` says why: a tier then skips, or fails under
``CI=true``.

**Running.** :class:`Prometheus` scrapes the targets it is given (every one on 127.0.0.0/8)
every second, stores in its work directory, listens on a free loopback port, and is stopped by
its PID. :meth:`Prometheus.query` runs PromQL through the HTTP API, as KEDA's prometheus scaler
does.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from testbed.ports import free_port
from testbed.processes import stop_process
from testbed.real.build import Progress, _locked, cache_root, to_stderr
from testbed.real.debian import APT, PackagesUnavailable

PACKAGE = "prometheus"


@dataclass(frozen=True)
class PrometheusBinaries:
    prometheus: Path
    promtool: Path
    version: str  # the Debian package version, e.g. 2.42.0+ds-5+deb12u1


def _candidate() -> str:
    """The version of ``prometheus`` apt would install here ("" when the package lists do not know it)."""
    proc = subprocess.run(
        ["apt-cache", "policy", PACKAGE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LANG": "C", "LC_ALL": "C"},
    )
    found = re.search(r"^\s*Candidate:\s*(\S+)", proc.stdout, re.MULTILINE)
    return "" if not found or found.group(1) == "(none)" else found.group(1)


def _apt_update(progress: Progress) -> None:
    if os.geteuid() != 0:
        raise PackagesUnavailable(f"apt does not know the {PACKAGE} package and only root can run apt-get update")
    progress("fetching the Debian package lists (apt-get update), once")
    proc = subprocess.run(
        [*APT, "update"],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    if proc.returncode != 0:
        raise PackagesUnavailable(f"apt-get update failed: {proc.stderr.strip()[-500:]}")


def binaries(progress: Progress = to_stderr) -> PrometheusBinaries:
    """``prometheus`` and ``promtool`` from Debian's package, fetched into the cache on first use."""
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None or shutil.which("dpkg-deb") is None:
        raise PackagesUnavailable(f"no apt-get/apt-cache/dpkg-deb to fetch Debian's {PACKAGE} package")
    version = _candidate()
    if not version:
        _apt_update(progress)
        version = _candidate()
        if not version:
            raise PackagesUnavailable(f"apt knows no {PACKAGE} package, even after apt-get update")
    dest = cache_root() / f"{PACKAGE}-{version.replace(':', '_')}"
    found = PrometheusBinaries(dest / "prometheus", dest / "promtool", version)
    if found.prometheus.is_file() and found.promtool.is_file():
        return found
    with _locked(dest.name):
        if found.prometheus.is_file() and found.promtool.is_file():
            return found
        started = time.monotonic()
        progress(f"fetching Debian's {PACKAGE} {version} (apt-get download, dpkg-deb -x) into {dest}")
        with tempfile.TemporaryDirectory(prefix="slime-prometheus-", dir=cache_root()) as tmp:
            work = Path(tmp)
            download = [*APT, "download", f"{PACKAGE}={version}"]
            proc = subprocess.run(download, cwd=work, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                _apt_update(progress)  # the lists name a version the mirror no longer has
                proc = subprocess.run(download, cwd=work, capture_output=True, text=True, timeout=900)
            debs = sorted(work.glob("*.deb"))
            if proc.returncode != 0 or not debs:
                raise PackagesUnavailable(f"apt-get download {PACKAGE}={version} failed: {proc.stderr.strip()[-500:]}")
            subprocess.run(
                ["dpkg-deb", "-x", str(debs[0]), str(work / "root")], check=True, capture_output=True, timeout=300
            )
            partial = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            for name in ("prometheus", "promtool"):
                shutil.copy2(work / "root" / "usr" / "bin" / name, partial / name)
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(partial, dest)
        progress(f"{PACKAGE} {version} ready in {time.monotonic() - started:.0f} s")
    return found


def promtool(progress: Progress = to_stderr) -> str:
    """``promtool`` from PATH, else the cached one from Debian's package (fetched on first use)."""
    return shutil.which("promtool") or str(binaries(progress).promtool)


def _loopback(target: str) -> bool:
    host = urlsplit(f"//{target}").hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Prometheus:
    """A Prometheus server on 127.0.0.1 scraping ``jobs`` (job name -> (metrics path, ["127.0.0.1:port", ...]))."""

    workdir: Path
    binaries: PrometheusBinaries
    jobs: dict[str, tuple[str, list[str]]]
    scrape_interval: str = "1s"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        for _, targets in self.jobs.values():
            for target in targets:
                if not _loopback(target):
                    raise ValueError(f"scrape target {target} is not on 127.0.0.0/8")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
            },
            "scrape_configs": [
                {"job_name": name, "metrics_path": path, "static_configs": [{"targets": targets}]}
                for name, (path, targets) in self.jobs.items()
            ],
        }

    def start(self, timeout: float = 60.0) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        args = [
            str(self.binaries.prometheus),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=2h",
            "--log.level=warn",
        ]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited {self.process.returncode}: {self.log_file.read_text(errors='replace')[-2000:]}"
                )
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"prometheus not ready after {timeout:.0f} s: {self.log_file.read_text(errors='replace')[-2000:]}"
        )

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 10 s."""
        proc, self.process = self.process, None
        if proc is not None:
            stop_process(proc)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query (``/api/v1/query``): the vector's samples, ``[{"metric": {...}, "value": [t, "v"]}]``."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        answer.raise_for_status()
        body = answer.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r}: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The value of a query that yields one sample (None: no sample)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> dict[str, str]:
        """Each active target's scrape URL -> its health (``up``, ``down``, ``unknown``)."""
        answer = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
        return {t["scrapeUrl"]: t["health"] for t in answer["data"]["activeTargets"]}
