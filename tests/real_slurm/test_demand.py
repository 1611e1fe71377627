"""Node demand against real Slurm 24.11 (issue 14): what the scaling service publishes for a real job mix.

Real slurmctld and slurmrestd, two real hosts that joined through the injection path, and the
pool's two other hosts known to Slurm as FUTURE node records (``scontrol create NodeName=...
State=FUTURE``; the first ``slurmd -Z`` of that name takes its record). Real Slurm shows why the
records matter: it refuses at submission ("Requested node configuration is not available", the
job FAILED with BadConstraints) any job asking more nodes than its partition has records for, so
a multi-node job can only wait for nodes Slurm knows of. The scaling service reads
slurmrestd as in production (a JWT signed with Slinky's key) and serves ``/demand/<partition>``
and ``slime_demand_*`` on its metrics port; every number asserted below is what real Slurm's
state gives under the rule of docs/scaling.md ("Node demand").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from testbed.capi_sim import JWT_KEY, JWT_NS, JWT_SECRET, MD, MD_NS, MIRROR, demand_config
from testbed.real.slurm import SlurmFailed
from testbed.real.slurm_site import Site, join
from testbed.services import Scaling
from testbed.wait import wait_for
from testbed.world import b64, ensure_namespace, machine_deployment, mirror

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]


def _reason(site: Site, job: int, expected: str) -> dict[str, Any]:
    """Wait until real slurmctld gives ``job`` the reason ``expected``; its record."""
    return wait_for(
        lambda: (j := site.slurm.jobs()[job])["state_reason"] == expected and j,
        30,
        f"job {job} pending with reason {expected} (it has {site.slurm.jobs()[job]['state_reason']})",
    )


def _demand(scaling: Scaling, partition: str, nodes: int) -> dict[str, Any]:
    def served() -> dict[str, Any] | None:
        answer = httpx.get(f"{scaling.running.metrics_url}/demand/{partition}", timeout=5)
        return answer.json() if answer.status_code == 200 and answer.json()["nodes"] == nodes else None

    body: dict[str, Any] = wait_for(served, 30, f"/demand/{partition} to say {nodes} nodes")
    return body


def test_demand_of_a_real_job_mix(site: Site, scaling_factory: Callable[..., Scaling]) -> None:
    slurm = site.slurm
    partition = slurm.config.partition
    join(site, 2)  # bm-001, bm-002 joined as dynamic nodes
    slurm.scontrol("create", "NodeName=bm-[003-004]", "CPUs=2", "State=FUTURE")  # the pool's hosts not provisioned yet
    emulator = site.emulator
    emulator.patch(
        "v1", "Secret", JWT_NS, JWT_SECRET, {"data": {JWT_KEY: b64(slurm.jwt_key)}}
    )  # the key slurmrestd verifies
    ensure_namespace(emulator, MD_NS)
    emulator.create(mirror(MIRROR, replicas=0, adopted_from=f"{MD_NS}/{MD}"))
    emulator.create(machine_deployment(MD, MD_NS, replicas=0))
    emulator.create(demand_config(slurm.restd_url, partition=partition, max_replicas=4))
    scaling = scaling_factory(emulator, demand_interval_seconds=0.5)

    running = slurm.sbatch("-N1", "--exclusive", "-w", "bm-001", "--wrap", "sleep 600")
    wait_for(lambda: slurm.jobs()[running]["job_state"] == ["RUNNING"], 30, f"job {running} to run on bm-001")
    big = slurm.sbatch("-N4", "--wrap", "srun hostname")
    held = slurm.sbatch("-N1", "--hold", "--wrap", "true")
    dependent = slurm.sbatch("-N1", f"--dependency=afterok:{running}", "--wrap", "true")
    later = slurm.sbatch("-N1", "--begin=now+3600", "--wrap", "true")
    # What real Slurm 24.11 says of each, and how the rule reads it:
    assert _reason(site, big, "Resources")["node_count"]["number"] == 4  # too few nodes up: counted, 4 nodes
    assert _reason(site, held, "JobHeldUser")["hold"] is True
    _reason(site, dependent, "Dependency")
    assert "begin_time" not in _reason(site, later, "BeginTime")  # only eligible_time says when
    body = _demand(scaling, partition, 5)
    assert (body["runningNodes"], body["pendingNodes"], body["pendingJobs"]) == (1, 4, 1)
    assert body["ignoredJobs"] == {"held": 1, "dependency": 1, "begin_time": 1, "never_fits": 0, "blocked": 0}
    labels = f'partition="{partition}"'
    assert scaling.metric("slime_demand_nodes", labels) == 5
    assert scaling.metric("slime_demand_pending_nodes", labels) == 4
    assert scaling.metric("slime_demand_running_nodes", labels) == 1
    assert scaling.metric("slime_demand_ignored_jobs", labels) == 3

    # More nodes than the partition has records for: refused at submission, so never a demand.
    with pytest.raises(SlurmFailed, match="Requested node configuration is not available"):
        slurm.sbatch("-N5", "--wrap", "true")
    # A record leaves (3 left): the queued 4-node job now waits with PartitionNodeLimit, still counted.
    slurm.scontrol("delete", "nodename=bm-004")
    _reason(site, big, "PartitionNodeLimit")
    assert _demand(scaling, partition, 5)["pendingNodes"] == 4
    # The running job ends: its node is no longer demand; the dependent job can never run (still ignored).
    slurm.client(["scancel", str(running)])
    _reason(site, dependent, "DependencyNeverSatisfied")
    body = _demand(scaling, partition, 4)
    assert (body["runningNodes"], body["pendingNodes"], body["ignoredJobs"]["dependency"]) == (0, 4, 1)
