"""The whole-loop tier starts BMO with the fixture provisioner by BMO's version: ``--test-mode`` up to v0.13,
``-provisioner=fixture`` from v0.14 (which removed ``--test-mode``), so moving to v0.14 is a change of the pin."""

from __future__ import annotations

import re

import pytest

from testbed.real.build import STACK
from testbed.real.metal3 import BMO_MODULE, bmo_fixture_flags


@pytest.mark.parametrize(
    ("version", "flags"),
    [
        ("v0.13.2", ["--test-mode"]),
        ("v0.9.0", ["--test-mode"]),
        ("v0.14.0-rc.0", ["-provisioner=fixture"]),
        ("v0.14.0", ["-provisioner=fixture"]),
        ("v0.14.1", ["-provisioner=fixture"]),
        ("v1.0.0", ["-provisioner=fixture"]),
    ],
)
def test_the_fixture_provisioner_flag_follows_bmos_version(version: str, flags: list[str]) -> None:
    assert bmo_fixture_flags(version) == flags


def test_the_pinned_bmo_is_the_one_stack_bmo_builds() -> None:
    """The flag is chosen from BMO_MODULE: it must name the version kit/stack/bmo/go.mod requires."""
    required = re.search(
        r"^require github\.com/metal3-io/baremetal-operator (\S+)$", (STACK / "bmo/go.mod").read_text(), re.M
    )
    assert required is not None and required.group(1) == BMO_MODULE[1]
