"""Safe scale-in against real Slurm 24.11: the scaling webhook, its safeScaleIn mapping pointing at real slurmrestd.

The JWT is signed from the ``jwt_hs256.key`` slurmctld verifies (held in a Secret on kubemu);
Machines carry ``status.addresses`` that name the real nodes; jobs are real (``sbatch --wrap
"sleep N"``). Each test covers a state only real Slurm produces: ``DYNAMIC_NORM`` on every
node, ``COMPLETING`` while an Epilog runs, ``NOT_RESPONDING`` and then ``DOWN`` after slurmd is
killed, ``DRAIN`` together with ``MIXED``/``ALLOCATED`` after an admin drains a busy node. The
seeded simulation (:mod:`tests.real_slurm.test_simulation`) runs them all together.

Nothing is lost either: a released node goes back to FUTURE (the default ``releasedNodes``), so
after a scale-in to 0 real Slurm still accepts a job as big as the pool and runs it once the
hosts boot again; ``releasedNodes: delete`` deletes the records.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import pytest

from scaling_webhook.safe_scale_in.config import SafeScaleInConfig
from scaling_webhook.safe_scale_in.victims import order_candidates
from scaling_webhook.slurm.machines import DRAIN_REASON
from scaling_webhook.slurm.slurmrestd import SlurmClient
from testbed.components.capi_sim import MD_NS
from testbed.components.slurm import SlurmFailed
from testbed.framework.pins import SlurmRelease
from testbed.framework.wait import wait_for
from testbed.scenarios.slurm_pool import Pool, SecretReader, future_records
from testbed.scenarios.slurm_site import SlurmSite

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]
SLURM_RELEASES = ("26.05", "24.11")  # Slinky v1.3's default, and the 24.11 of Slinky 1.0-1.2 (conftest.py)


def test_idle_dynamic_nodes_are_drained_deleted_from_slurm_and_released_the_busy_one_stays(
    pool: Callable[..., Pool], caplog: pytest.LogCaptureFixture, slurm_release: SlurmRelease
) -> None:
    caplog.set_level(logging.INFO, logger="slime.scaling.slurmrestd")
    p = pool(3, releasedNodes="delete")  # the records go (the default keeps them: the next test)
    assert p.states() == {f"bm-00{i}": {"IDLE", "DYNAMIC_NORM"} for i in (1, 2, 3)}
    job = p.run("bm-002", 300)
    assert p.states()["bm-002"] == {"MIXED", "DYNAMIC_NORM"}  # one of two CPUs
    p.scale(1)
    assert sorted(p.capi.annotated()) == ["md-001", "md-003"] and p.replicas() == 1
    nodes = p.slurm.nodes()
    for host in ("bm-001", "bm-003"):
        assert nodes[host]["state"] == ["IDLE", "DRAIN", "DYNAMIC_NORM"]
        assert (nodes[host]["reason"], nodes[host]["reason_set_by_user"]) == (DRAIN_REASON, "slurm")
    assert nodes["bm-002"]["state"] == ["MIXED", "DYNAMIC_NORM"]
    p.capi.step()  # CAPI deletes the marked Machines; each is released once its node is deleted in Slurm
    p.capi.wait_all_released(p.reconcile)  # (the webhook's own watch-driven passes may release them first)
    assert sorted(p.slurm.nodes()) == ["bm-002"] and future_records(p.slurm) == {}
    assert sorted(p.capi.removed) == ["md-001", "md-003"]
    assert [m["metadata"]["name"] for m in p.capi.machines()] == ["md-002"]
    assert p.capi.violations == []
    assert p.slurm.jobs()[job]["job_state"] == ["RUNNING"]
    assert len(p.events("SlurmNodeDeleted")) == 2
    versions = [
        r.__dict__.get("api_version") for r in caplog.records if r.getMessage() == "slurmrestd API version discovered"
    ]
    assert versions == [slurm_release.api_version]  # probed newest first: newer ones are a 404


def test_a_pool_scaled_in_to_0_keeps_its_hosts_records_and_grows_again(
    site: SlurmSite, pool: Callable[..., Pool], slurm_release: SlurmRelease
) -> None:
    """Nothing lost: the released nodes go back to FUTURE, a job as big as the pool is still accepted, and runs when
    the hosts return.

    bm-a took a FUTURE record the operator declared (docs/install.md); bm-b is a purely dynamic
    node (its ``slurmd -Z`` made its record). Both are kept. Their hosts are named after their
    BareMetalHosts, so the Machines of the next scale-up boot them under the same names.
    """
    slurm = site.slurm
    slurm.scontrol("create", "NodeName=bm-a", "CPUs=2", "State=FUTURE")
    p = pool(2, hosts=("bm-a", "bm-b"))
    assert (
        p.states() == {"bm-a": {"IDLE", "DYNAMIC_NORM"}, "bm-b": {"IDLE", "DYNAMIC_NORM"}}
        and future_records(slurm) == {}
    )
    p.scale(0)
    assert sorted(p.capi.annotated()) == ["md-001", "md-002"] and p.replicas() == 0
    p.capi.step()
    p.capi.wait_all_released(p.reconcile)
    assert p.capi.machines() == [] and p.slurm.nodes() == {} and p.capi.violations == []
    kept = future_records(slurm)
    assert {name: node["state"] for name, node in kept.items()} == {
        "bm-a": ["FUTURE", "DYNAMIC_NORM"],
        "bm-b": ["FUTURE", "DYNAMIC_NORM"],
    }
    # DRAIN is gone; 24.11 keeps the reason until the node next runs a job, 26.05 clears it with DRAIN.
    assert kept["bm-a"]["reason"] == (DRAIN_REASON if slurm_release.series == "24.11" else "")
    events = p.events("SlurmNodeReturnedToFuture")
    assert (
        len(events) == 2
        and all("returned to FUTURE" in e["message"] for e in events)
        and p.events("SlurmNodeDeleted") == []
    )
    # Real Slurm still counts both records: a 2-node job is accepted and queues; a 3-node one is refused
    # at submission by 24.11, queued by 26.05 waiting for a third record (PartitionNodeLimit).
    if slurm_release.series == "24.11":
        with pytest.raises(SlurmFailed, match="Requested node configuration is not available"):
            slurm.sbatch("-N3", "--wrap", "true")
    else:
        too_big = slurm.sbatch("-N3", "--wrap", "true")
        wait_for(lambda: slurm.jobs()[too_big]["state_reason"] == "PartitionNodeLimit", 20, "the 3-node job to wait")
        slurm.client(["scancel", str(too_big)])
    job = slurm.sbatch("-N2", "--wrap", "srun hostname")
    wait_for(lambda: slurm.jobs()[job]["state_reason"] not in ("None", ""), 20, f"job {job} to pend with a reason")
    assert slurm.jobs()[job]["job_state"] == ["PENDING"]
    # (A held job proves nothing here: Slurm does not check a held job's node count at submission.)
    held = slurm.sbatch("-N3", "--hold", "--wrap", "true")
    assert slurm.jobs()[held]["state_reason"] == "JobHeldUser"
    p.scale(2)  # new Machines; their hosts boot bm-a and bm-b again, each slurmd -Z takes its record
    p.capi.step()
    assert sorted(p.capi.assigned[m["metadata"]["name"]] for m in p.capi.live()) == ["bm-a", "bm-b"]
    nodes = p.slurm.nodes()
    for machine, node in p.capi.hosts.items():
        assert nodes[node.hostname]["address"] == node.net.address and "DRAIN" not in nodes[node.hostname]["state"], (
            machine
        )
    assert future_records(slurm) == {}
    wait_for(lambda: slurm.jobs()[job]["job_state"] == ["COMPLETED"], 60, f"job {job} to run on the returned hosts")
    assert sorted(slurm.hostnames(slurm.jobs()[job]["nodes"])) == ["bm-a", "bm-b"]
    p.reconcile()
    assert all(
        p.capi.held(m["metadata"]["name"]) for m in p.capi.live()
    )  # the new Machines carry the pre-terminate hook
    assert p.capi.violations == []


def test_completing_is_never_a_victim_and_a_draining_completing_node_is_held(pool: Callable[..., Pool]) -> None:
    p = pool(2)
    p.run("bm-002", 300)
    short = p.slurm.sbatch("-w", "bm-001", "--wrap", "sleep 1")
    (p.slurm.shared / f"hold-epilog-{short}").touch()  # the Epilog waits while this file exists
    wait_for(lambda: "COMPLETING" in p.states()["bm-001"], 20, "bm-001 to be COMPLETING (its epilog runs)")
    assert p.states()["bm-001"] == {"IDLE", "COMPLETING", "DYNAMIC_NORM"}
    p.scale(1)
    assert p.capi.annotated() == [] and p.replicas() == 2  # both busy: deferred
    (event,) = wait_for(lambda: p.events("ScaleInDeferred")[:1], 10, "the deferral")
    assert "md-001 (COMPLETING)" in event["message"] and "md-002 (MIXED)" in event["message"]
    # An operator deletes the Machine of the COMPLETING node: the hook holds it, SliMe drains it and waits.
    p.site.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")
    p.reconcile()
    p.reconcile()
    assert p.states()["bm-001"] == {"IDLE", "DRAIN", "COMPLETING", "DYNAMIC_NORM"} and p.capi.held("md-001")
    assert p.capi.step() == [] and "bm-001" in p.slurm.nodes()
    (p.slurm.shared / f"hold-epilog-{short}").unlink()  # the epilog ends
    wait_for(lambda: "COMPLETING" not in p.states()["bm-001"], 20, "the epilog to end")
    p.capi.wait_all_released(p.reconcile)
    assert "bm-001" not in p.slurm.nodes() and "md-001" in p.capi.removed
    assert p.capi.violations == []


def test_an_admin_drain_of_a_busy_node_is_held_and_no_admin_drain_is_ever_undone(pool: Callable[..., Pool]) -> None:
    p = pool(3)
    p.run("bm-001", 300)
    p.admin_drain("bm-001", "maintenance: disk swap")
    p.admin_drain("bm-003", "maintenance: bios")
    states = p.states()
    assert states["bm-001"] == {
        "MIXED",
        "DRAIN",
        "DYNAMIC_NORM",
    }  # DRAIN with a job: only real Slurm shows this (draining)
    assert states["bm-003"] == {"IDLE", "DRAIN", "DYNAMIC_NORM"}

    def admin_drains_intact() -> None:
        nodes = p.slurm.nodes()
        assert (nodes["bm-001"]["state"][1], nodes["bm-001"]["reason"]) == ("DRAIN", "maintenance: disk swap")
        if "bm-003" in nodes:
            assert "DRAIN" in nodes["bm-003"]["state"] and nodes["bm-003"]["reason"] == "maintenance: bios"
            assert nodes["bm-003"]["reason_set_by_user"] == "root"

    def undrained() -> None:
        # After an UNDRAIN slurmctld pings the node again: NOT_RESPONDING for about half a second (real Slurm only).
        wait_for(lambda: p.states()["bm-002"] == {"IDLE", "DYNAMIC_NORM"}, 10, "bm-002 undrained and idle")

    p.scale(2)
    assert p.capi.annotated() == ["md-002"]  # an idle node before the admin's idle one; never the busy one
    admin_drains_intact()
    p.scale(3)  # reclaimed: our drain undone
    assert p.capi.annotated() == []
    undrained()
    admin_drains_intact()
    p.scale(1)  # two victims: the idle node, then the admin's idle one; the busy admin-drained one stays
    assert sorted(p.capi.annotated()) == ["md-002", "md-003"] and p.replicas() == 1
    admin_drains_intact()
    p.scale(3)  # both reclaimed: ours undrained, the admin's keeps its drain
    assert p.capi.annotated() == []
    undrained()
    admin_drains_intact()
    # An operator deletes the Machine of the busy, admin-drained node: held while its job runs.
    p.site.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")
    p.reconcile()
    assert p.capi.held("md-001") and p.capi.step() == []
    admin_drains_intact()
    assert p.capi.violations == []


def test_a_killed_slurmd_not_responding_then_down_goes_first(pool: Callable[..., Pool]) -> None:
    p = pool(3)
    node = p.capi.hosts["md-003"]
    node.kill_slurmd(signal.SIGKILL)
    seen = [sorted(p.states()["bm-003"])]
    wait_for(lambda: "NOT_RESPONDING" in p.states()["bm-003"], 60, "slurmctld to mark bm-003 NOT_RESPONDING")
    seen.append(sorted(p.states()["bm-003"]))
    # The product's ordering on the real node list at that moment: the dead node first, before the idle ones.
    client = SlurmClient(
        SecretReader(p.slurm.jwt_key), SafeScaleInConfig(slurmrestd=p.slurm.restd_url, jwt_secret=("slurm", "jwt"))
    )
    try:
        eligible, _ = order_candidates(p.capi.live(), client.nodes())
    finally:
        client.close()
    assert [c.machine for c in eligible][0] == "md-003" and "NOT_RESPONDING" in eligible[0].why
    wait_for(lambda: "DOWN" in p.states()["bm-003"], 60, "slurmctld to set bm-003 DOWN")
    seen.append(sorted(p.states()["bm-003"]))
    assert seen[-1] == ["DOWN", "DYNAMIC_NORM", "NOT_RESPONDING"]
    p.scale(2)
    assert p.capi.annotated() == ["md-003"]  # before md-001 and md-002, idle
    assert p.states()["bm-003"] == {"DOWN", "DRAIN", "NOT_RESPONDING", "DYNAMIC_NORM"}
    p.capi.step()
    p.capi.wait_all_released(p.reconcile)  # DOWN+DRAIN runs nothing: Slurm deletes it, the Machine goes
    assert "bm-003" not in p.slurm.nodes()
    assert p.capi.removed == ["md-003"] and p.capi.violations == []


def test_slurmrestd_stopped_mid_run_no_release_and_scale_up_still_works(pool: Callable[..., Pool]) -> None:
    p = pool(3)
    p.run("bm-001", 300)
    p.scale(1)
    assert sorted(p.capi.annotated()) == ["md-002", "md-003"]
    p.slurm.stop_restd()
    assert p.capi.step() == []  # CAPI deletes them; the hooks hold them: Slurm cannot be read
    for _ in range(3):
        p.reconcile()
    assert p.capi.held("md-002") and p.capi.held("md-003") and p.capi.step() == []
    assert {"bm-002", "bm-003"} <= set(p.slurm.nodes())  # still in Slurm, drained, hosts still on
    (event,) = wait_for(lambda: p.events("SlurmUnavailable")[:1], 10, "the SlurmUnavailable event")
    assert "cannot reach slurmrestd" in event["message"] and "eyJ" not in event["message"]
    p.scale(4)  # a scale-up needs no slurmrestd
    assert p.replicas() == 4
    p.capi.step()  # three new hosts boot from injected metaData and join slurmctld (it is up)
    assert {"bm-004", "bm-005", "bm-006"} <= set(p.slurm.nodes())
    assert p.capi.held("md-002") and p.capi.held("md-003")
    p.slurm.start_restd()
    p.capi.wait_all_released(p.reconcile)
    assert not {"bm-002", "bm-003"} & set(p.slurm.nodes())
    assert sorted(p.capi.removed) == ["md-002", "md-003"]
    assert len(p.capi.live()) == 4 and p.capi.violations == []
