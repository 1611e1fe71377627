"""The air-gapped build of docs/install.md, run as written: the base image by digest, the wheels from a mirror.

The command is taken from the page ("Air-gapped sites") and run in the checkout with the values a
machine without a registry has here: ``PYTHON_IMAGE`` is the debootstrap'd base image named by its
digest (``localhost/slime-python-base@sha256:...``), ``PIP_INDEX_URL`` a PEP 503 index of the
lock's wheels (downloaded once with ``pip download --require-hashes``) served over HTTPS on
127.0.0.1 by this test, with a CA of its own passed as the ``pip_ca`` build secret, and no host CA
bundle mounted. Two options are added that the page's build machine does not need:
``--network=host`` (the index listens on the host's loopback) and ``--pull=never``. The index's
log shows every wheel of the lock was fetched from it; the image carries the labels and answers
``--version`` with the revision given.
"""

from __future__ import annotations

import hashlib
import html
import re
import shlex
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from testbed.components.image import ImageFailed, ensure_base_image, ensure_podman, podman
from testbed.framework.paths import REPO_ROOT, cache_root
from testbed.framework.pki import make_pki
from testbed.framework.prerequisites import unavailable

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(1800)]

LOCK = REPO_ROOT / "requirements.lock"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def documented_build() -> list[str]:
    """The podman build of docs/install.md's "Air-gapped sites", as argv."""
    text = (REPO_ROOT / "docs" / "install.md").read_text()
    section = text.split("### Air-gapped sites\n", 1)[1]
    (block,) = re.findall(r"```sh\n(podman build .*?)```", section, re.S)[:1]
    return shlex.split(block.replace("\\\n", " "))


def wheels() -> Path:
    """The lock's wheels (and setuptools, to build the project), downloaded once per lock."""
    directory = cache_root() / f"airgap-wheels-{hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]}"
    done = directory / ".complete"
    if not done.exists():
        directory.mkdir(parents=True, exist_ok=True)
        for args in (["--require-hashes", "-r", str(LOCK)], ["setuptools>=69"]):
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(directory), *args],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if proc.returncode != 0:
                unavailable(f"pip download for the local index: {proc.stderr[-500:]}")
        done.touch()
    return directory


def simple_index(root: Path, files: Path) -> None:
    """A PEP 503 index of ``files``: /simple/<project>/ pages linking each file with its sha256."""
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(files.glob("*.whl")):
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(project, []).append(wheel)
    for project, found in projects.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="/files/{html.escape(w.name)}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
            f"{html.escape(w.name)}</a>\n"
            for w in found
        )
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (root / "files").symlink_to(files)


class Index:
    """The index over HTTPS on 127.0.0.1; ``fetched`` holds every path it served."""

    def __init__(self, root: Path, cert: Path, key: Path) -> None:
        self.fetched: list[str] = []
        outer = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                outer.fetched.append(self.path)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/simple"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    pki = make_pki(tmp_path / "pki")
    simple_index(tmp_path / "index", wheels())
    served = Index(tmp_path / "index", pki.cert_file, pki.key_file)
    served.ca_file = pki.ca_file  # type: ignore[attr-defined]
    yield served
    served.stop()


def test_the_documented_air_gapped_build(index: Index) -> None:
    try:
        ensure_podman()
        base = ensure_base_image()
    except ImageFailed as exc:
        unavailable(f"podman or the base image: {exc}")
    digest = podman("image", "inspect", base, "--format", "{{.Digest}}").stdout.decode().strip()
    by_digest = f"{base.rsplit(':', 1)[0]}@{digest}"
    command = documented_build()
    assert command[:2] == ["podman", "build"] and command[-1] == "."
    tag = command[command.index("-t") + 1]
    args: list[str] = []
    for arg in command[2:-1]:
        if arg.startswith("PYTHON_IMAGE="):
            assert "@sha256:" in arg, "the page gives the base image by digest"
            arg = f"PYTHON_IMAGE={by_digest}"
        elif arg.startswith("PIP_INDEX_URL="):
            arg = f"PIP_INDEX_URL={index.url}"
        elif arg.startswith("id=pip_ca,src="):
            arg = f"id=pip_ca,src={index.ca_file}"  # type: ignore[attr-defined]
        elif arg.startswith("REVISION="):
            arg = f"REVISION={REVISION}"
        args.append(arg)
    assert {"--secret", "--build-arg"} <= set(args)
    tag = f"{tag}-airgap-test"
    args[args.index("-t") + 1] = tag
    podman("build", "--pull=never", "--network=host", "--no-cache", *args, str(REPO_ROOT), timeout=1800)

    served = {Path(p).name for p in index.fetched if p.startswith("/files/")}
    locked = {w.name for w in wheels().glob("*.whl") if not w.name.startswith("setuptools-")}
    assert locked <= served, f"not fetched from the index: {sorted(locked - served)}"
    labels = podman("image", "inspect", tag, "--format", "{{json .Config.Labels}}").stdout.decode()
    assert f'"org.opencontainers.image.revision":"{REVISION}"' in labels
    assert '"org.opencontainers.image.version":"' in labels and "https://git.internal.example/hpc/slime" in labels
    run = podman("run", "--rm", "--network=none", tag, "injection-webhook", "--version").stdout.decode()
    assert run.strip().endswith(f"(revision {REVISION})")
    # The CA was a build secret: no file of the image holds it.
    ca_line = Path(index.ca_file).read_text().splitlines()[1]  # type: ignore[attr-defined]
    found = podman(
        "run",
        "--rm",
        "--network=none",
        "--user=0",
        tag,
        "grep",
        "-rlF",
        ca_line,
        "/opt",
        "/etc",
        "/tmp",
        "/run",
        check=False,
    )
    assert found.returncode == 1 and not found.stdout, found.stdout
    podman("rmi", tag, check=False)
