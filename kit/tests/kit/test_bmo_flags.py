"""The whole-loop tier starts BMO with the fixture provisioner by BMO's version: ``--test-mode`` up to v0.13,
``-provisioner=fixture`` from v0.14 (which removed ``--test-mode``), so moving to v0.14 is a change of the pin
(``kit/tests/kit/test_pins.py`` holds the pin to ``kit/stack/bmo/go.mod``)."""

from __future__ import annotations

import pytest

from testbed.components.metal3 import bmo_fixture_flags


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
