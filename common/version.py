"""Which SliMe this is: the version of the installed package and the git commit its image was built from.

The version has one source, ``pyproject.toml`` (read back from the installed distribution's
metadata). The revision is what the image build wrote into ``SLIME_BUILD_REVISION`` (the
Dockerfile's ``REVISION`` build argument, also its ``org.opencontainers.image.revision`` label),
``unknown`` outside such an image (a source checkout). Both appear in ``--version``, in the first
log line of each service, in the ``slime_build_info`` metric and on the health port's ``/version``.
"""

from __future__ import annotations

import os
from importlib import metadata

DISTRIBUTION = "slime"
REVISION_ENV = "SLIME_BUILD_REVISION"
UNKNOWN = "unknown"


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def revision() -> str:
    return os.environ.get(REVISION_ENV, "").strip() or UNKNOWN


def build_info() -> dict[str, str]:
    """``{"version": ..., "revision": ...}``: the labels of ``slime_build_info``, the body of ``/version``."""
    return {"version": version(), "revision": revision()}


def version_line(prog: str) -> str:
    """What ``<prog> --version`` prints."""
    return f"{prog} {version()} (revision {revision()})"
