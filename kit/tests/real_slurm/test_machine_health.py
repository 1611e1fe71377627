"""Machine health against real Slurm: a host booted with a wrong ``slurm.key`` never registers, is reported, and with
``remediate: true`` is replaced by one that joins, while a busy node is never touched.

Real here: slurmctld refusing the host's credential (its slurmd runs and never becomes a node), slurmrestd's
node list and single-node reads, the jobs. Played: Cluster API (the MachineSet stand-in of the real-Slurm
tier: it replaces a deleted Machine with one whose host boots from a metaData Secret the injection webhook
admitted). The time from the fault to the report and to a replacement that has joined goes to the tier's
figures (docs/reliability.md).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import pytest

from common.names import HEALTH_CONDITION, REMEDIATED_ANNOTATION, SLURM_KEY_KEY
from testbed.components.capi_sim import MD, MD_NS, MIRROR, pool_config_map
from testbed.components.services import Scaling
from testbed.framework.objects import machine_deployment, mirror
from testbed.framework.wait import wait_for
from testbed.framework.world import make_slurm_key, md_replicas
from testbed.scenarios.slurm_capi import RealCapi
from testbed.scenarios.slurm_site import SlurmSite

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(300)]
SLURM_RELEASES = ("26.05",)  # the judgement reads what every release shows (no node); one release keeps the tier short
REGISTRATION_SECONDS = 8  # registrationTimeout: long enough for a good host to join (seconds here), short to wait for


def wrong_key(meta: dict[str, Any]) -> None:
    """A host image whose key is not the Controller's (made for the test; never a real one)."""
    meta[SLURM_KEY_KEY] = base64.b64encode(make_slurm_key()).decode()


def health(capi: RealCapi, machine: str) -> dict[str, Any] | None:
    found = capi.machine(machine)
    conditions = ((found or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == HEALTH_CONDITION), None)


def test_a_host_with_a_wrong_key_is_reported_and_replaced_by_one_that_joins_a_busy_node_is_untouched(
    site: SlurmSite, scaling_factory: Callable[..., Scaling], figures: dict[str, Any]
) -> None:
    emulator = site.emulator
    emulator.create(mirror(MIRROR, replicas=3, adopted_from=f"{MD_NS}/{MD}"))
    emulator.create(machine_deployment(MD, MD_NS, replicas=3))
    capi = RealCapi(emulator, site=site)
    good = [capi.add_machine(), capi.add_machine()]  # each boots and joins
    job = site.slurm.sbatch("-w", capi.hostname(good[0]), "--wrap", "sleep 600")
    wait_for(lambda: site.slurm.jobs()[job]["job_state"] == ["RUNNING"], 20, f"job {job} to run")
    bad = capi.add_machine(provision=False)
    fault_at = time.monotonic()
    capi.provision(bad, image_fault=wrong_key)
    slurm_health = {"registrationTimeout": f"{REGISTRATION_SECONDS}s", "remediate": True, "maxUnhealthy": 1}
    emulator.create(pool_config_map(site.slurm.restd_url, slurm_health=slurm_health))
    scaling = scaling_factory(emulator)

    def reported() -> dict[str, Any] | None:
        scaling.reconcile()
        found = health(capi, bad)
        return found if found and found.get("status") == "False" else None

    found = wait_for(reported, REGISTRATION_SECONDS + 30, f"{bad} reported", interval=1.0)
    reported_after = time.monotonic() - fault_at
    assert found["reason"] == "NeverRegistered", found
    assert capi.hostname(bad) not in site.slurm.node_states()  # slurmctld never made it a node
    deleting = capi.machine(bad) or {}
    assert deleting["metadata"].get("deletionTimestamp"), "remediate: true deletes the Machine"
    assert deleting["metadata"]["annotations"][REMEDIATED_ANNOTATION] == "NeverRegistered"
    assert all(health(capi, m) is None for m in good)  # nothing written on healthy Machines
    assert md_replicas(emulator, MD_NS, MD) == 3  # the pool is never lowered
    capi.step()  # the MachineSet replaces it: the new host boots from an admitted Secret and joins
    replacement = next(m["metadata"]["name"] for m in capi.live() if m["metadata"]["name"] not in (*good, bad))
    joined_after = time.monotonic() - fault_at
    scaling.reconcile()
    assert capi.hostname(replacement) in site.slurm.node_states()
    assert health(capi, replacement) is None and bad in capi.removed
    assert site.slurm.jobs()[job]["job_state"] == ["RUNNING"]  # the busy node and its job: untouched
    assert not (capi.machine(good[0]) or {})["metadata"].get("deletionTimestamp")
    assert capi.violations == [] and md_replicas(emulator, MD_NS, MD) == 3
    assert scaling.metric("slime_scaling_remediations_total", 'reason="NeverRegistered"') == 1
    assert scaling.metric("slime_scaling_unhealthy_machines", f'mapping="{MD_NS}/{MD}",reason="NeverRegistered"') == 0
    figures["machine_health_wrong_key"] = {
        "registration_timeout_s": REGISTRATION_SECONDS,
        "reported_after_s": round(reported_after, 1),
        "replacement_joined_after_s": round(joined_after, 1),
    }
