"""The image build docs/release.md writes, run as written: it makes the chart's default image.

docs/release.md, step 4, builds with ``podman build -t localhost/slime:<version> .`` from the
checkout. This test takes that command from the page (so the page cannot drift from what is run),
runs it with podman in the repository, and checks that the result is the image the chart runs by
default (``localhost/slime:<appVersion>``), runs as uid 65532, holds the three console scripts,
and that ``slime-check --help`` runs in it. Two arguments are added that a build machine with a
registry does not need: the base image (``--build-arg PYTHON_IMAGE=``, the debootstrap'd one, as
no container registry is reachable here) and ``--pull=never``. The push commands are not run:
no registry is reachable here (docs/release.md says so).
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from testbed.components.image import HOST_CA_BUNDLE, ImageFailed, ensure_base_image, ensure_podman, podman
from testbed.framework.paths import REPO_ROOT
from testbed.framework.prerequisites import unavailable

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(1800)]

APP_VERSION = str(yaml.safe_load((REPO_ROOT / "charts" / "slime" / "Chart.yaml").read_text())["appVersion"])


def documented_build() -> list[str]:
    """The ``podman build`` line of docs/release.md's image step."""
    text = (REPO_ROOT / "docs" / "release.md").read_text()
    lines = re.findall(r"^\s*(podman build -t \S+ \.)\s*$", text, re.M)
    assert len(lines) == 1, f"docs/release.md should give one podman build line, found {lines}"
    return shlex.split(lines[0])


def test_the_documented_build_makes_the_charts_default_image() -> None:
    command = documented_build()
    ref = command[command.index("-t") + 1]
    assert ref == f"localhost/slime:{APP_VERSION}", "docs/release.md builds another tag than the chart's default"
    try:
        ensure_podman()
        base = ensure_base_image()
    except ImageFailed as exc:
        unavailable(f"podman or the base image: {exc}")
    extra = ["--pull=never", "--network=host", "--build-arg", f"PYTHON_IMAGE={base}"]
    if HOST_CA_BUNDLE.is_file():
        extra += ["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    # podman build <extra> -t <ref> . (run in the checkout, as the page says)
    podman(*command[1:2], *extra, *command[2:-1], str(REPO_ROOT), timeout=1800)

    user = podman("image", "inspect", ref, "--format", "{{.Config.User}}").stdout.decode().strip()
    assert user.split(":")[0] == "65532"
    found = podman(
        "run",
        "--rm",
        "--network=none",
        ref,
        "python",
        "-c",
        "import shutil; print(' '.join(str(bool(shutil.which(c))) for c in "
        "('injection-webhook', 'scaling-webhook', 'slime-check')))",
    )
    assert found.stdout.decode().split() == ["True", "True", "True"]
    helped = podman("run", "--rm", "--network=none", ref, "slime-check", "--help")
    assert "usage: slime-check" in helped.stdout.decode()
