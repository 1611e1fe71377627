"""Node demand against real Slurm 26.05 and 24.11: what the scaling service publishes for a real job mix.

Real slurmctld and slurmrestd, two real hosts that joined through the injection path, and the
pool's two other hosts known to Slurm as FUTURE node records (``scontrol create NodeName=...
State=FUTURE``; the first ``slurmd -Z`` of that name takes its record). The releases part on one
point: a job asking more nodes than its partition has records for is refused at submission by
24.11 ("Requested node configuration is not available", the job FAILED with BadConstraints) but
accepted by 26.05, which queues it (``PartitionNodeLimit``; with no record at all,
``PartitionConfig``) and runs it once enough hosts have joined. The scaling service reads
slurmrestd as in production (a JWT signed with Slinky's key) and serves ``/demand/<partition>``
and ``slime_demand_*`` on its metrics port; every number asserted below is what real Slurm's
state gives under the rule of docs/scaling.md ("Node demand").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from testbed.components.capi_sim import JWT_KEY, JWT_NS, JWT_SECRET, MD, MD_NS, MIRROR, demand_config
from testbed.components.services import Scaling
from testbed.components.slurm import SlurmFailed
from testbed.framework.objects import b64, machine_deployment, mirror
from testbed.framework.pins import SlurmRelease
from testbed.framework.wait import wait_for
from testbed.framework.world import ensure_namespace
from testbed.scenarios.slurm_site import SlurmSite, join

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]
SLURM_RELEASES = ("26.05", "24.11")  # conftest.py: each test that asks for slurm_release runs on both


def _reason(site: SlurmSite, job: int, expected: str) -> dict[str, Any]:
    """Wait until real slurmctld gives ``job`` the reason ``expected``; its record."""
    return wait_for(
        lambda: (j := site.slurm.jobs()[job])["state_reason"] == expected and j,
        30,
        f"job {job} pending with reason {expected} (it has {site.slurm.jobs()[job]['state_reason']})",
    )


def _demand(scaling: Scaling, partition: str, nodes: int, **ignored: int) -> dict[str, Any]:
    """The first /demand answer that says ``nodes`` nodes (and, if given, these ``ignoredJobs`` counts).

    A poll taken before the last submission may already say the same number of nodes: waiting on
    the ignored counts too keeps a stale answer from being read as the final one.
    """

    def served() -> dict[str, Any] | None:
        answer = httpx.get(f"{scaling.running.metrics_url}/demand/{partition}", timeout=5)
        if answer.status_code != 200:
            return None
        body = answer.json()
        fits = body["nodes"] == nodes and all(body["ignoredJobs"].get(k) == v for k, v in ignored.items())
        return body if fits else None

    body: dict[str, Any] = wait_for(served, 30, f"/demand/{partition} to say {nodes} nodes {ignored or ''}")
    return body


def _serve_demand(site: SlurmSite, scaling_factory: Callable[..., Scaling]) -> Scaling:
    """The mirror, the MachineDeployment, a demand mapping (maxReplicas 4) and the scaling service reading
    slurmrestd."""
    emulator = site.emulator
    emulator.patch(
        "v1", "Secret", JWT_NS, JWT_SECRET, {"data": {JWT_KEY: b64(site.slurm.jwt_key)}}
    )  # the key slurmrestd verifies
    ensure_namespace(emulator, MD_NS)
    emulator.create(mirror(MIRROR, replicas=0, adopted_from=f"{MD_NS}/{MD}"))
    emulator.create(machine_deployment(MD, MD_NS, replicas=0))
    emulator.create(demand_config(site.slurm.restd_url, partition=site.slurm.config.partition, max_replicas=4))
    return scaling_factory(emulator, demand_interval_seconds=0.5)


def test_demand_of_a_real_job_mix(
    site: SlurmSite, scaling_factory: Callable[..., Scaling], slurm_release: SlurmRelease
) -> None:
    slurm = site.slurm
    partition = slurm.config.partition
    join(site, 2)  # bm-001, bm-002 joined as dynamic nodes
    slurm.scontrol("create", "NodeName=bm-[003-004]", "CPUs=2", "State=FUTURE")  # the pool's hosts not provisioned yet
    scaling = _serve_demand(site, scaling_factory)

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
    body = _demand(scaling, partition, 5, held=1, dependency=1, begin_time=1)
    assert (body["runningNodes"], body["pendingNodes"], body["pendingJobs"]) == (1, 4, 1)
    assert body["ignoredJobs"] == {"held": 1, "dependency": 1, "begin_time": 1, "never_fits": 0, "blocked": 0}
    labels = f'partition="{partition}"'
    assert scaling.metric("slime_demand_nodes", labels) == 5
    assert scaling.metric("slime_demand_pending_nodes", labels) == 4
    assert scaling.metric("slime_demand_running_nodes", labels) == 1
    assert scaling.metric("slime_demand_ignored_jobs", labels) == 3

    # More nodes than the partition has records for: 24.11 refuses it at submission; 26.05 queues it
    # (PartitionNodeLimit), and the rule leaves it out: more nodes than the pool's maxReplicas (4).
    if slurm_release.series == "24.11":
        with pytest.raises(SlurmFailed, match="Requested node configuration is not available"):
            slurm.sbatch("-N5", "--wrap", "true")
    else:
        too_big = slurm.sbatch("-N5", "--wrap", "true")
        _reason(site, too_big, "PartitionNodeLimit")
        assert _demand(scaling, partition, 5, never_fits=1)["pendingNodes"] == 4
        slurm.client(["scancel", str(too_big)])
    # A record leaves (3 left): the queued 4-node job now waits with PartitionNodeLimit, still counted.
    slurm.scontrol("delete", "nodename=bm-004")
    _reason(site, big, "PartitionNodeLimit")
    assert _demand(scaling, partition, 5)["pendingNodes"] == 4
    # The running job ends: its node is no longer demand; the dependent job can never run (still ignored).
    slurm.client(["scancel", str(running)])
    _reason(site, dependent, "DependencyNeverSatisfied")
    body = _demand(scaling, partition, 4)
    assert (body["runningNodes"], body["pendingNodes"], body["ignoredJobs"]["dependency"]) == (0, 4, 1)


@pytest.mark.slurm_releases("26.05")
def test_on_26_05_a_job_queues_with_no_node_record_and_runs_when_the_hosts_join(
    site: SlurmSite, scaling_factory: Callable[..., Scaling]
) -> None:
    """Slurm 26.05 queues a job its partition has no node for (PartitionConfig): demand counts it, and it runs once
    hosts join.

    (24.11 refuses such a job at submission, which is why docs/install.md has operators declare
    FUTURE records; on 26.05 they are no longer needed for jobs to queue.)
    """
    slurm = site.slurm
    partition = slurm.config.partition
    scaling = _serve_demand(site, scaling_factory)
    job = slurm.sbatch("-N2", "--wrap", "srun hostname")
    _reason(site, job, "PartitionConfig")
    body = _demand(scaling, partition, 2)
    assert (body["pendingNodes"], body["pendingJobs"], body["runningNodes"]) == (2, 1, 0)
    join(site, 2)
    wait_for(lambda: slurm.jobs()[job]["job_state"] == ["COMPLETED"], 60, f"job {job} to run on the joined hosts")
    _demand(scaling, partition, 0)
