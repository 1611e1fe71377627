"""Real Cluster API under the scaling webhook: scale-up from zero, bare-metal nodes join real Slurm, safe scale-in.

The MachineDeployment → MachineSet → Machine chain, the ``delete-machine`` priority and the
pre-terminate hook are the CAPI core controller manager v1.14.2's own behaviour; only CAPM3, the
baremetal-operator, cloud-init and the kubelet are simulated (:mod:`testbed.real.machines`,
every shortcut listed there). The mirror is scaled through kube-apiserver, so the chart's
scaling webhook admits it and its leader moves the MachineDeployment; each host boots the
documented user-data with the ``metaData`` Secret the chart's injection webhook completed, and
its slurmd joins the real slurmctld 24.11. See docs/testing.md ("Real Cluster API").
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.real.capi_site import SPEC, Prepared, Site, site
from testbed.real.components import component

pytestmark = [pytest.mark.real_loop, pytest.mark.timeout(900)]

DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
PRE_TERMINATE = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slime"
JOIN_KEYS = {"slurm_controller_host", "slurm_controller_port", "slurm_conf_server", "slurm_key_base64"}


@pytest.fixture(scope="module")
def capi_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    prepared: Prepared = component("capi")
    with site(tmp_path_factory.mktemp("capi"), prepared, hosts=2) as s:
        yield s


def slurm_node(s: Site, machine: dict[str, Any]) -> str:
    """The Slurm node of a Machine: its host booted with ``local-hostname`` = the Machine's name (metal3-dev-env's template)."""
    return str(machine["metadata"]["name"])


def no_key_in_logs(s: Site) -> None:
    keys = [s.slinky.key, base64.b64encode(s.slinky.key), s.slinky.jwt_key, base64.b64encode(s.slinky.jwt_key)]
    for name, text in s.logs().items():
        raw = text.encode()
        assert not any(k in raw for k in keys if k), f"a key appears in the {name} log"


def test_scale_up_from_zero_joins_real_nodes_and_safe_scale_in_keeps_the_busy_one(capi_site: Site) -> None:
    s = capi_site
    assert s.md_replicas() == 0 and s.machines() == []
    # KEDA's part, by hand: the mirror through kube-apiserver; the scaling webhook's leader moves the MachineDeployment.
    s.wait_for(
        lambda: s.api.get("apps/v1", "Deployment", "slime-system", "mirror-a") is not None, 60, "the chart's mirror"
    )
    s.wait_for(
        lambda: (
            (s.api.get("apps/v1", "Deployment", "slime-system", "mirror-a") or {}).get("spec", {}).get("replicas") == 0
        ),
        60,
        "the mirror adopted at the MachineDeployment's 0",
    )
    started = time.monotonic()
    s.scale_mirror(2)
    s.wait_for(lambda: s.md_replicas() == 2, 60, "the MachineDeployment to follow the mirror to 2")
    followed = time.monotonic()
    # CAPI: a MachineSet, two Machines, two Metal3Machines; the simulated hosts boot; nodeRef -> Running.
    running = s.wait_for(lambda: s.running_exactly(2), 240, "2 Machines Running")
    names = [slurm_node(s, m) for m in running]
    assert {m["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"] for m in running} == {SPEC.pool}
    for machine in running:
        assert machine["spec"]["providerID"].startswith(f"metal3://{SPEC.namespace}/host-")
        metadata = s.metadata(machine["metadata"]["name"])
        assert set(metadata) >= JOIN_KEYS, sorted(metadata)
        assert metadata["slurm_conf_server"] == s.slurm.conf_server  # injected by the chart's webhook, as stored
        assert base64.b64decode(metadata["slurm_key_base64"]) == s.slinky.key, (
            "the injected key is not Slinky's slurm.key"
        )
    states = s.wait_for(lambda: s.idle_nodes(names), 120, "both nodes to join slurmctld")
    assert set(states) == set(names)
    joined = time.monotonic()
    print(
        f"\n[capi] mirror scaled 0 -> 2: MachineDeployment followed after {followed - started:.1f} s, "
        f"both Machines Running and both slurmd joined after {joined - started:.1f} s"
    )
    for machine in running:  # SliMe's pre-terminate hook is on every Machine of the opted-in pool before any deletion
        s.wait_for(
            lambda m=machine: (
                PRE_TERMINATE in (s.machine(m["metadata"]["name"]) or {}).get("metadata", {}).get("annotations", {})
            ),
            60,
            f"SliMe's pre-terminate hook on {machine['metadata']['name']}",
        )
    # A real job on one node; the other stays idle.
    busy, idle = names
    job = s.job_on(busy, "release-busy")

    # Scale-in by one: SliMe drains the idle node, marks its Machine delete-machine, lowers the MachineDeployment;
    # CAPI's MachineSet deletes exactly that Machine (the annotation's priority), the pre-terminate hook holds it
    # until SliMe returned the node to FUTURE in Slurm (its record kept for the host); then the host is deprovisioned.
    idle_host = next(m for m in running if m["metadata"]["name"] == idle)["spec"]["providerID"].split("/")[-2]
    s.scale_mirror(1)
    s.wait_for(lambda: s.md_replicas() == 1, 60, "the MachineDeployment to follow the mirror to 1")
    s.wait_for(lambda: s.machine(idle) is None, 180, f"Machine {idle} (the idle node's) to be deleted and gone")
    host = s.host(idle_host)  # deprovisioned and released before CAPI let the Machine go
    assert (host["status"]["provisioning"]["state"], host["spec"].get("consumerRef"), host["spec"]["online"]) == (
        "available",
        None,
        False,
    )
    log = s.manager.log.read_text(errors="replace")
    # CAPI's own choice, from its log: the MachineSet scaled down by deleting exactly the Machine SliMe annotated
    # (cluster.x-k8s.io/delete-machine, whatever the Random deletion order). Its node was drained and idle, so
    # SliMe may take the hook off before CAPI's first look at the deleting Machine: no wait need show here.
    assert f'"Machine {SPEC.namespace}/{idle} deleting (scale down, deleting 1 of 1)"' in log, (
        "CAPI did not scale down by the marked Machine"
    )
    assert f'"Machine {SPEC.namespace}/{busy} deleting (scale down' not in log
    assert s.machine(busy) is not None and not s.machine(busy)["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert idle not in s.slurm.nodes(), (
        "SliMe returns the drained node to FUTURE (hidden from the node list) before releasing the hook"
    )
    assert s.slurm.jobs()[job]["job_state"] == ["RUNNING"]
    assert len(s.events("SlurmNodeReturnedToFuture")) >= 1
    assert s.sim.violations == []

    # An operator deletes the busy Machine: CAPI waits for SliMe's pre-terminate hook, SliMe drains the node in
    # Slurm and holds it while the job runs. CAPI's MachineSet counts a deleting Machine (cluster-api#3434):
    # no replacement until it is gone.
    s.cp.kubectl("-n", SPEC.namespace, "delete", "machine", busy, "--wait=false")

    def held() -> bool:
        machine = s.machine(busy) or {}
        conditions = {c["type"]: c for c in (machine.get("status") or {}).get("conditions") or []}
        deleting = conditions.get("Deleting") or {}
        return (
            bool(machine.get("metadata", {}).get("deletionTimestamp"))
            and deleting.get("reason") == "WaitingForPreTerminateHook"
            and "DRAIN" in s.slurm.node_states().get(busy, set())
        )

    s.wait_for(held, 120, f"CAPI to hold Machine {busy} on the pre-terminate hook, SliMe to drain {busy}")
    assert any(
        '"Waiting for pre-terminate hooks to succeed"' in line
        and f'Machine="{SPEC.namespace}/{busy}"' in line
        and PRE_TERMINATE in line
        for line in s.manager.log.read_text(errors="replace").splitlines()
    ), "CAPI's own log says it waits for SliMe's hook"
    watched_until = (
        time.monotonic() + 5
    )  # it stays so while the job runs (CAPI and SliMe reconcile on every Machine change)
    while time.monotonic() < watched_until:
        time.sleep(0.5)
        machine = s.machine(busy)
        assert machine is not None and PRE_TERMINATE in machine["metadata"]["annotations"], (
            "the hook holds the busy Machine"
        )
        assert [m["metadata"]["name"] for m in s.machines()] == [busy]
        assert s.slurm.jobs()[job]["job_state"] == ["RUNNING"] and s.sim.violations == []
    # The job ends by itself: SliMe returns the node to FUTURE in Slurm, takes the hook off; CAPI drains, the host goes.
    s.end_job("release-busy")
    s.wait_for(lambda: s.machine(busy) is None, 180, f"Machine {busy} to go once its job ended")
    assert s.slurm.jobs()[job]["job_state"] == ["COMPLETED"], "no job was killed"
    assert busy not in s.slurm.nodes()
    assert s.sim.violations == [], s.sim.violations
    # Now the MachineSet replaces it, on a freed host, and the new node joins with injected data.
    replacement = s.wait_for(lambda: s.running_exactly(1), 240, "the MachineSet's replacement Machine to run")
    new_node = slurm_node(s, replacement[0])
    assert new_node not in (busy, idle)
    s.wait_for(lambda: "IDLE" in s.slurm.node_states().get(new_node, set()), 120, f"{new_node} to join slurmctld")
    assert [m["metadata"]["name"] for m in s.machines()] == [new_node]
    no_key_in_logs(s)
