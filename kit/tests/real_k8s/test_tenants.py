"""Two tenants on one real management cluster: each gets its own Slurm key and only its own.

The chart is upgraded with the operator's bindings (tenant-a to slurm-a, tenant-b to slurm-b), and the
injection webhook restarted on them, as a `helm upgrade` rolls its pod. CAPM3 (impersonated, as it is
the configured requester) creates each tenant's metaData Secret; the real API server calls the webhook
through the chart's configuration and the webhook reads the Slinky objects through the chart's RBAC.
A tenant that relabels its own template to name the other tenant's Slurm namespace gets no key.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
import yaml

from common.names import CAPM3_MANAGER_USERNAME
from testbed.framework.objects import metadata_secret
from testbed.framework.world import SlurmCluster, ensure_namespace, seed_capm3_identity, seed_metal3, seed_slinky
from testbed.scenarios.stack import Stack

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]

AS_CAPM3 = f"--as={CAPM3_MANAGER_USERNAME}"
TENANT_B = "system:serviceaccount:tenant-b:operator"


def restart_injection(stack: Stack) -> None:
    stack.pods["injection"].stop()
    stack.start_webhook("injection").wait_ready()


@pytest.fixture
def tenants(stack: Stack) -> Iterator[dict[str, SlurmCluster]]:
    """Slinky in slurm-a and slurm-b, Metal3 objects in tenant-a and tenant-b, and the chart bound accordingly."""
    saved = json.loads(json.dumps(stack.release.values))
    slurm = {}
    for tenant in ("a", "b"):
        ensure_namespace(stack.api, f"tenant-{tenant}")
        slurm[tenant] = seed_slinky(
            stack.api, namespace=f"slurm-{tenant}", host_ip=f"192.0.2.{20 + ord(tenant) - 97}", complete_refs=True
        )
    seed_capm3_identity(stack.api, ("tenant-a", "tenant-b"))
    stack.release.values["injection"]["slurmBindings"] = ["tenant-a=slurm-a", "tenant-b=slurm-b"]
    stack.release.upgrade()
    restart_injection(stack)
    try:
        yield slurm
    finally:
        stack.release.values = saved
        stack.release.upgrade()
        restart_injection(stack)


def create_as(stack: Stack, who: str, secret: dict[str, object]) -> tuple[dict[str, str], str]:
    """Create the metaData Secret as ``who``; (the stored metaData, what kubectl printed on stderr)."""
    proc = stack.cp.kubectl("create", who, "-o", "json", "-f", "-", stdin=yaml.safe_dump(secret))
    stored: dict[str, str] = yaml.safe_load(base64.b64decode(json.loads(proc.stdout)["data"]["metaData"]))
    return stored, proc.stderr


def test_each_tenant_gets_only_its_own_key_and_a_relabelled_template_gets_none(
    stack: Stack, tenants: dict[str, SlurmCluster]
) -> None:
    for tenant in ("a", "b"):
        _, data = seed_metal3(
            stack.api,
            namespace=f"tenant-{tenant}",
            template_labels={"slurm-controller-namespace": f"slurm-{tenant}"},
            index=30,
        )
        stored, _ = create_as(stack, AS_CAPM3, metadata_secret(data, machine=f"m3m-{tenant}"))
        # Compared, never printed.
        assert base64.b64decode(stored["slurm_key_base64"]) == tenants[tenant].key, f"tenant-{tenant}: not its key"
        other = tenants["b" if tenant == "a" else "a"]
        assert base64.b64decode(stored["slurm_key_base64"]) != other.key
    # Tenant B may edit its own templates: it points its template at tenant A's Slurm namespace.
    stack.cp.kubectl(
        "create", "role", "templates", "-n", "tenant-b", "--verb=get,patch", "--resource=metal3datatemplates"
    )
    stack.cp.kubectl("create", "rolebinding", "templates", "-n", "tenant-b", "--role=templates", f"--user={TENANT_B}")
    stack.cp.kubectl(
        "label",
        f"--as={TENANT_B}",
        "-n",
        "tenant-b",
        "metal3datatemplate",
        "workers-template",
        "slurm-controller-namespace=slurm-a",
        "--overwrite",
    )
    _, data = seed_metal3(
        stack.api, namespace="tenant-b", template_labels={"slurm-controller-namespace": "slurm-a"}, index=31
    )

    def withheld() -> bool:
        stored, stderr = create_as(stack, AS_CAPM3, metadata_secret(data, machine=f"m3m-b-{len(attempts)}"))
        attempts.append(stored)
        return "slurm_key_base64" not in stored and "not bound to the Slurm namespace" in stderr

    attempts: list[dict[str, str]] = []
    stack.wait_for(withheld, 30, "a Secret of the relabelled template admitted without join data")
    for stored in attempts:
        key = base64.b64decode(stored.get("slurm_key_base64", ""))
        assert key != tenants["a"].key, "tenant B received tenant A's slurm.key"
