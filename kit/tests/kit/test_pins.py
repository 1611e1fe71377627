"""The one table of pins holds: every Go module kit/stack builds from requires the version pins.py names."""

from __future__ import annotations

import re

import pytest

from testbed.framework.paths import STACK
from testbed.framework.pins import GO_MODULES, INTERVALS, KUBE_VERSION, KUBERNETES, GoModule


def required(stack: str) -> dict[str, str]:
    """module path -> version of every ``require`` (block or line) of ``kit/stack/<stack>/go.mod``."""
    text = (STACK / stack / "go.mod").read_text()
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*(?:require\s+)?([\w.\-/]+\.[\w.\-/]+)\s+(v\S+)", line)
        if match and not line.lstrip().startswith(("module", "go ", "replace", "exclude", "//")):
            found[match.group(1)] = match.group(2)
    return found


@pytest.mark.parametrize("module", [m for m in GO_MODULES if m.stack], ids=lambda m: f"{m.stack}:{m.path}")
def test_each_stack_module_requires_the_pinned_version(module: GoModule) -> None:
    assert required(module.stack).get(module.path) == module.version, (
        f"kit/stack/{module.stack}/go.mod and testbed/framework/pins.py disagree on {module.path}"
    )


def test_every_stack_module_is_pinned() -> None:
    """Each kit/stack module builds at least one pinned module: a new one gets its row in pins.py."""
    stacks = {path.parent.name for path in STACK.glob("*/go.mod")}
    assert stacks == {m.stack for m in GO_MODULES if m.stack}


def test_the_control_planes_staging_modules_are_the_pinned_release() -> None:
    """k8s.io/kubernetes vX.Y.Z is built with every staging module replaced by its published v0.Y.Z."""
    staging = f"v0.{KUBE_VERSION.removeprefix('v').split('.', 1)[1]}"
    text = (STACK / KUBERNETES.stack / "go.mod").read_text()
    replaced = dict(re.findall(r"^\s*(k8s\.io/[\w.\-/]+) => k8s\.io/[\w.\-/]+ (v\S+)", text, re.M))
    assert len(replaced) > 25, replaced
    assert {version for version in replaced.values()} == {staging}, replaced


def test_a_pin_check_catches_a_disagreement() -> None:
    moved = GoModule(KUBERNETES.path, "v1.36.4", KUBERNETES.stack)
    assert required(moved.stack).get(moved.path) != moved.version


def test_every_interval_polls_more_often_than_it_waits() -> None:
    assert all(0 < interval.poll < interval.timeout for interval in INTERVALS.values())
