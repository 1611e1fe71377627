"""Key rotation: when Slinky's key Secret changes, the next node provisioned gets the new key.

The chart's injection webhook (the chart's pod, behind the real kube-apiserver) keeps the key
Secret in an informer cache, so a new key reaches new nodes as soon as the watch delivers the
update, with no restart. The test rotates the key, then has CAPM3 (impersonated) create one
metaData Secret after another until the stored one carries the new key, and measures how long
that took from the update's answer (the figure in docs/operations.md, "Rotating the Slurm key").
Once a Secret got the new key, no later one may get the old key. It then puts the old key back
the same way, so the rest of the session sees the Controller as seeded.

Hosts already running keep the key they booted with: that part is the rolling re-provision in
docs/operations.md, not exercised here (this tier has no hosts).
"""

from __future__ import annotations

import base64
import time

import pytest
import yaml

from common.names import CAPM3_MANAGER_USERNAME, OPT_IN_LABEL
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import metadata_secret
from testbed.framework.world import make_slurm_key, seed_metal3
from testbed.scenarios.stack import Stack

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]

ATTEMPTS = 400  # a bound on the Secrets created while waiting for the new key (each is a full admission)
FIRST_INDEX = 100  # Metal3Data indexes no other test of the session uses


def injected_key(stack: Stack, index: int) -> bytes:
    """The slurm.key CAPM3's next metaData Secret is stored with."""
    _, data = seed_metal3(stack.api, template_labels={OPT_IN_LABEL: "slurm"}, index=index)
    secret = metadata_secret(data, machine=f"m3m-rotation-{index}")
    stack.api.as_user(CAPM3_MANAGER_USERNAME).create(secret)
    stored = stack.api.get("v1", "Secret", secret["metadata"]["namespace"], secret["metadata"]["name"])
    assert stored is not None
    metadata = yaml.safe_load(base64.b64decode(stored["data"]["metaData"]))
    return base64.b64decode(metadata["slurm_key_base64"])


def rotate(stack: Stack, key: bytes, index: int) -> tuple[float, int, int]:
    """Write ``key`` into the Controller's key Secret; returns (seconds until a new Secret got it, the Secrets
    created until then, the next free index). Compares keys, never prints them."""
    name = stack.slurm.key_secret or "slurm-auth-slurm"
    stack.api.patch("v1", "Secret", "slurm", name, {"data": {"slurm.key": base64.b64encode(key).decode()}})
    updated = time.monotonic()
    for attempt in range(1, ATTEMPTS + 1):
        got = injected_key(stack, index)
        index += 1
        if got == key:
            elapsed = time.monotonic() - updated
            for _ in range(5):  # from then on, only the new key
                assert injected_key(stack, index) == key, "a Secret got the old key after one had the new key"
                index += 1
            return elapsed, attempt, index
    raise AssertionError(f"{ATTEMPTS} metaData Secrets created after the key changed, none got the new key")


def test_a_rotated_key_reaches_the_next_node(stack: Stack) -> None:
    original = stack.slurm.key
    assert injected_key(stack, FIRST_INDEX) == original, "before the rotation the Controller's key is injected"
    new = make_slurm_key()
    assert new != original
    try:
        elapsed, attempts, index = rotate(stack, new, FIRST_INDEX + 1)
    finally:
        back, _, _ = rotate(stack, original, FIRST_INDEX + ATTEMPTS + 10)
    figure = (
        f"key rotation: the first metaData Secret with the new key was created {elapsed * 1000:.0f} ms after "
        f"the key Secret's update ({attempts} Secret(s) created until then); back to the old key: {back * 1000:.0f} ms"
    )
    print(figure)
    EVIDENCE.add_line(figure)
