"""The RBAC audit itself: it covers a run of both services, and it refuses a call the chart does not allow.

The audit runs at the end of every session (tests/conftest.py). These tests make ``pytest -k
rbac`` exercise it too: one starts both services through a short story (so the session's audit
has their calls to check), the other proves the audit fails on a call no rule permits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kubemu import Emulator, RecordedRequest
from testbed.components.services import Scaling, start_injection
from testbed.framework.audit import audit_rbac
from testbed.framework.objects import SLIME_NAMESPACE, config_map, machine_deployment, metadata_secret, mirror
from testbed.framework.pki import Pki
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.world import seed_metal3, seed_slinky


def test_rbac_audit_covers_a_story_of_both_services(
    emulator: Emulator, pki: Pki, tmp_path: Path, scaling_factory: Callable[..., Scaling]
) -> None:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels={"slurm-controller-namespace": "slurm"})
    emulator.create(mirror("mirror-a", replicas=1))
    emulator.create(machine_deployment("md-a", "metal3", replicas=1))
    emulator.create(
        config_map(
            {"mappings": "- mirror: slime-system/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"}
        )
    )
    injection = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    try:
        assert injection.review("/mutate", secret_request(metadata_secret(data)))["patchType"] == "JSONPatch"
    finally:
        injection.stop()
    scaling = scaling_factory(emulator)
    assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 2))["allowed"] is True
    agents = {call.user_agent.split("/")[0] for call in emulator.requests}
    assert {"slime-injection-webhook", "slime-scaling-webhook"} <= agents


def test_rbac_audit_fails_on_a_call_the_chart_does_not_allow(tmp_path: Path) -> None:
    forbidden = RecordedRequest(
        verb="delete",
        api_group="cluster.x-k8s.io",
        version="v1beta1",
        resource="machinedeployments",
        subresource="",
        namespace="metal3",
        name="md-a",
        path="/apis/cluster.x-k8s.io/v1beta1/namespaces/metal3/machinedeployments/md-a",
        method="DELETE",
        status_code=200,
        user_agent="slime-scaling-webhook/0.1",
    )
    with pytest.raises(AssertionError, match="delete"):
        audit_rbac([forbidden], {"scaling-webhook"}, tmp_path)


def test_rbac_audit_fails_when_a_started_service_made_no_call(tmp_path: Path) -> None:
    with pytest.raises(
        AssertionError, match="injection-webhook was started in this session but no API call of it was recorded"
    ):
        audit_rbac([], {"injection-webhook"}, tmp_path)
