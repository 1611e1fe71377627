"""Debian's Prometheus for the tiers: fetched once into the cache, run on 127.0.0.1.

**Fetching.** :func:`binaries` takes the ``prometheus`` package at the version apt offers
(``apt-cache policy``; ``apt-get update`` once, only when the lists do not know it), fetches the
``.deb`` with ``apt-get download`` and unpacks it with ``dpkg-deb -x``: nothing is installed on
the host. ``prometheus`` and ``promtool`` go to ``<cache>/prometheus-<version>/`` (the cache of
:func:`testbed.framework.paths.cache_root`), so later runs find them by version. Both binaries are Go
programs that need only libc. Without apt (or without root for the one ``apt-get update``)
:class:`testbed.framework.debian.PackagesUnavailable` says why: a tier then skips, or fails under
``CI=true``.

**Running.** :class:`Prometheus` scrapes the targets it is given (every one on 127.0.0.0/8)
every second, stores in its work directory, listens on a free loopback port, and is stopped by
its PID. :meth:`Prometheus.query` runs PromQL through the HTTP API, as KEDA's prometheus scaler
does.
"""

from __future__ import annotations

import ipaddress
import os
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

from testbed.framework.debian import PackagesUnavailable, apt_update, candidate, download
from testbed.framework.errors import ComponentFailed
from testbed.framework.paths import cache_root, locked
from testbed.framework.ports import free_port
from testbed.framework.processes import spawn, stop_process, wait_started
from testbed.framework.progress import Progress, to_stderr

PACKAGE = "prometheus"


@dataclass(frozen=True)
class PrometheusBinaries:
    prometheus: Path
    promtool: Path
    version: str  # the Debian package version, e.g. 2.42.0+ds-5+deb12u1


def binaries(progress: Progress = to_stderr) -> PrometheusBinaries:
    """``prometheus`` and ``promtool`` from Debian's package, fetched into the cache on first use."""
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None or shutil.which("dpkg-deb") is None:
        raise PackagesUnavailable(f"no apt-get/apt-cache/dpkg-deb to fetch Debian's {PACKAGE} package")
    version = candidate(PACKAGE)
    if not version:
        apt_update(progress)
        version = candidate(PACKAGE)
        if not version:
            raise PackagesUnavailable(f"apt knows no {PACKAGE} package, even after apt-get update")
    dest = cache_root() / f"{PACKAGE}-{version.replace(':', '_')}"
    found = PrometheusBinaries(dest / "prometheus", dest / "promtool", version)
    if found.prometheus.is_file() and found.promtool.is_file():
        return found
    with locked(dest.name):
        if not (found.prometheus.is_file() and found.promtool.is_file()):
            _fetch(version, dest, progress)
    return found


def _fetch(version: str, dest: Path, progress: Progress) -> None:
    """``apt-get download`` the package and unpack its two binaries into ``dest`` (nothing installed)."""
    started = time.monotonic()
    progress(f"fetching Debian's {PACKAGE} {version} (apt-get download, dpkg-deb -x) into {dest}")
    with tempfile.TemporaryDirectory(prefix="slime-prometheus-", dir=cache_root()) as tmp:
        work = Path(tmp)
        deb = download(PACKAGE, version, work, progress)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True, capture_output=True, timeout=300)
        partial = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for name in ("prometheus", "promtool"):
            shutil.copy2(work / "root" / "usr" / "bin" / name, partial / name)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(partial, dest)
    progress(f"{PACKAGE} {version} ready in {time.monotonic() - started:.0f} s")


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

    def start(self, timeout: float | str = "apiserver-start") -> Prometheus:
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
        self.process = spawn(args, self.log_file)
        try:
            wait_started(self.process, self.ready, timeout, "prometheus", self.log_file, retry_on=(httpx.HTTPError,))
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200

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
            raise ComponentFailed(f"prometheus: query {expr!r}: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The value of a query that yields one sample (None: no sample)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None
