"""Real Cluster API and Metal3 under the scaling webhook: scale-up from zero, bare-metal nodes join real Slurm, safe
scale-in.

The MachineDeployment → MachineSet → Machine chain, the ``delete-machine`` priority and the
pre-terminate hook are the CAPI core controller manager v1.14.2's own behaviour; the Metal3Machines,
Metal3Data and ``metaData`` Secrets are CAPM3 v1.13.2's, the BareMetalHosts' states the
baremetal-operator v0.13.2's (test mode: no Ironic). The mirror is scaled through kube-apiserver, so
the chart's scaling webhook admits it and its leader moves the MachineDeployment; CAPM3 creates
each ``metaData`` Secret as its own ServiceAccount and the chart's injection webhook completes it;
each provisioned host boots its config drive with real cloud-init, which runs the documented
user-data, and its slurmd joins the real slurmctld 26.05. The hosts run no kubelet (no Node, no
nodeRef): CAPI ignores pre-drain hooks on such Machines, SliMe's pre-terminate hook holds them.
See docs/testing.md ("Real Cluster API").
"""

from __future__ import annotations

import base64
import stat
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.names import CAPM3_MANAGER_USERNAME
from testbed.components.metal3 import BMO_USERNAME
from testbed.scenarios.capi import SPEC, CapiParts, CapiSite, site
from testbed.scenarios.prepare import part

pytestmark = [pytest.mark.real_loop, pytest.mark.real_parts("capi"), pytest.mark.timeout(900)]

DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
PRE_TERMINATE = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slime"
JOIN_KEYS = {
    "slurm_controller_host",
    "slurm_controller_port",
    "slurm_conf_server",
    "slurm_key_base64",
    "slurm_hosts_base64",
}


@pytest.fixture(scope="module")
def capi_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CapiSite]:
    prepared: CapiParts = part("capi")
    with site(tmp_path_factory.mktemp("capi"), prepared, hosts=2) as s:
        yield s


def slurm_node(s: CapiSite, machine: dict[str, Any]) -> str:
    """The Slurm node of a Machine: its host booted with ``local-hostname`` = the Machine's name (metal3-dev-env's
    template)."""
    return str(machine["metadata"]["name"])


def audited(s: CapiSite, verb: str, secret: str) -> list[dict[str, Any]]:
    """kube-apiserver's audit events of ``verb`` on the Secret ``secret`` of the pool's namespace."""
    return [
        e
        for e in s.cp.audit_events()
        if e.get("stage") == "ResponseComplete"
        and e.get("verb") == verb
        and (e.get("objectRef") or {}).get("resource") == "secrets"
        and (e.get("objectRef") or {}).get("namespace") == SPEC.namespace
        and (e.get("objectRef") or {}).get("name") == secret
    ]


def no_key_in_logs(s: CapiSite) -> None:
    keys = [s.slinky.key, base64.b64encode(s.slinky.key), s.slinky.jwt_key, base64.b64encode(s.slinky.jwt_key)]
    for name, text in s.logs().items():
        raw = text.encode()
        assert not any(k in raw for k in keys if k), f"a key appears in the {name} log"


def files_users_can_read_with_the_key(s: CapiSite) -> list[str]:
    """Files a booted host's local users could read that hold slurm.key (raw or base64): what cloud-init wrote to the
    host's disk and to /run (docs/install.md: the user-data makes cloud-init's instance-data.json root-only)."""
    keys = [s.slinky.key, base64.b64encode(s.slinky.key)]
    found = []
    for booted in s.booter.booted.values():
        for top in (booted.node.upper, booted.node.dir / "run"):
            for path in top.rglob("*"):
                mode = path.lstat().st_mode
                if stat.S_ISREG(mode) and mode & stat.S_IROTH and any(k in path.read_bytes() for k in keys):
                    found.append(f"{booted.host}: {path.relative_to(top)} ({stat.filemode(mode)})")
    return found


def scale_up_from_zero(s: CapiSite) -> list[dict[str, Any]]:
    """The mirror 0 -> 2 through kube-apiserver; two Machines Provisioned, both nodes joined: the Machines."""
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
    # CAPI: a MachineSet, two Machines, two Metal3Machines; CAPM3 claims two hosts and creates their metaData
    # Secrets; BMO provisions the hosts; each boots with cloud-init. No kubelet: Provisioned, no nodeRef.
    running: list[dict[str, Any]] = s.wait_for(lambda: s.provisioned_exactly(2), 300, "2 Machines Provisioned")
    names = [slurm_node(s, m) for m in running]
    # What the injection is for: both hosts' slurmd join slurmctld with the join data cloud-init found on the drive.
    states = s.wait_for(lambda: s.idle_nodes(names), 120, "both nodes to join slurmctld")
    assert set(states) == set(names)
    instance_data = [b.node.dir / "run/cloud-init/instance-data.json" for b in s.booter.booted.values()]
    assert instance_data and all(p.is_file() for p in instance_data), "cloud-init wrote no instance-data.json"
    assert files_users_can_read_with_the_key(s) == [], "a file a local user can read holds slurm.key"
    joined = time.monotonic()
    print(
        f"\n[capi] mirror scaled 0 -> 2: MachineDeployment followed after {followed - started:.1f} s, "
        f"both Machines Provisioned and both slurmd joined after {joined - started:.1f} s"
    )
    assert {m["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"] for m in running} == {SPEC.pool}
    assert s.api.list("v1", "nodes") == [], "no host runs a kubelet"
    return running


def check_injected(s: CapiSite, machine: dict[str, Any]) -> None:
    """A provisioned Machine: no Node, its metaData Secret created by CAPM3, completed by the injection webhook, read
    (not changed) by BMO."""
    name = machine["metadata"]["name"]
    assert machine["spec"]["providerID"].startswith(f"metal3://{SPEC.namespace}/host-")
    assert not (machine.get("status") or {}).get("nodeRef"), "a host without a kubelet has no Node"
    metadata = s.metadata(name)
    assert set(metadata) >= JOIN_KEYS, sorted(metadata)
    assert metadata["slurm_conf_server"] == s.slurm.conf_server  # injected by the chart's webhook, as stored
    assert base64.b64decode(metadata["slurm_key_base64"]) == s.slinky.key, "the injected key is not Slinky's slurm.key"
    # CAPM3 created the Secret under its own identity (the one the webhook gives join data to).
    created = [(e["user"]["username"], e["responseStatus"]["code"]) for e in audited(s, "create", f"{name}-metadata")]
    assert [c for c in created if c[1] == 201] == [(CAPM3_MANAGER_USERNAME, 201)], created
    assert {user for user, _ in created} == {CAPM3_MANAGER_USERNAME}, created
    # BMO read the host's metaData Secret (its secret manager labels it, with an UPDATE): admitted, nothing changed.
    claimed = [(before, after) for secret, before, after in s.booter.claims if secret == f"{name}-metadata"]
    assert len(claimed) == 1 and claimed[0][0] == claimed[0][1], f"BMO's UPDATE of {name}-metadata changed its data"
    updated = [(e["user"]["username"], e["responseStatus"]["code"]) for e in audited(s, "update", f"{name}-metadata")]
    assert updated == [(BMO_USERNAME, 200)], updated


def host_of(running: list[dict[str, Any]], name: str) -> str:
    return str(next(m for m in running if m["metadata"]["name"] == name)["spec"]["providerID"].split("/")[-2])


def scale_in_takes_the_idle_node(s: CapiSite, running: list[dict[str, Any]], busy: str, idle: str, job: int) -> None:
    """Scale-in by one: SliMe drains the idle node, marks its Machine delete-machine, lowers the MachineDeployment;
    CAPI's MachineSet deletes exactly that Machine (the annotation's priority), the pre-terminate hook holds it
    until SliMe returned the node to FUTURE in Slurm (its record kept for the host); then the host is
    deprovisioned."""
    idle_host = host_of(running, idle)
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
    assert s.booter.violations == []


def deleting_the_busy_machine_waits_for_its_job(s: CapiSite, busy_host: str, busy: str, job: int) -> None:
    """An operator deletes the busy Machine: CAPI waits for SliMe's pre-terminate hook, SliMe drains the node in
    Slurm and holds it while the job runs. CAPI's MachineSet counts a deleting Machine (cluster-api#3434): no
    replacement until it is gone."""
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
    watched_until = time.monotonic() + 5  # it stays so while the job runs (CAPI and SliMe reconcile on every change)
    while time.monotonic() < watched_until:
        time.sleep(0.5)
        machine = s.machine(busy)
        assert machine is not None and PRE_TERMINATE in machine["metadata"]["annotations"], (
            "the hook holds the busy Machine"
        )
        assert [m["metadata"]["name"] for m in s.machines()] == [busy]
        assert s.host(busy_host)["status"]["provisioning"]["state"] == "provisioned", "the busy host stays provisioned"
        assert s.booter.node(busy) is not None, "the busy host stays powered on"
        assert s.slurm.jobs()[job]["job_state"] == ["RUNNING"] and s.booter.violations == []
    # The job ends by itself: SliMe returns the node to FUTURE in Slurm, takes the hook off; CAPI drains, the host goes.
    s.end_job("release-busy")
    s.wait_for(lambda: s.machine(busy) is None, 180, f"Machine {busy} to go once its job ended")
    assert s.slurm.jobs()[job]["job_state"] == ["COMPLETED"], "no job was killed"
    assert busy not in s.slurm.nodes()
    assert s.booter.violations == [], s.booter.violations


def test_scale_up_from_zero_joins_real_nodes_and_safe_scale_in_keeps_the_busy_one(capi_site: CapiSite) -> None:
    s = capi_site
    running = scale_up_from_zero(s)
    for machine in running:
        check_injected(s, machine)
    for machine in running:  # SliMe's pre-terminate hook is on every Machine of the opted-in pool before any deletion
        s.wait_for(
            lambda m=machine: (
                PRE_TERMINATE in (s.machine(m["metadata"]["name"]) or {}).get("metadata", {}).get("annotations", {})
            ),
            60,
            f"SliMe's pre-terminate hook on {machine['metadata']['name']}",
        )
    # A real job on one node; the other stays idle.
    busy, idle = (slurm_node(s, m) for m in running)
    job = s.job_on(busy, "release-busy")
    scale_in_takes_the_idle_node(s, running, busy, idle, job)
    deleting_the_busy_machine_waits_for_its_job(s, host_of(running, busy), busy, job)
    # Now the MachineSet replaces it, on a freed host, and the new node joins with injected data.
    replacement = s.wait_for(lambda: s.provisioned_exactly(1), 300, "the MachineSet's replacement Machine")
    new_node = slurm_node(s, replacement[0])
    assert new_node not in (busy, idle)
    s.wait_for(lambda: "IDLE" in s.slurm.node_states().get(new_node, set()), 120, f"{new_node} to join slurmctld")
    assert [m["metadata"]["name"] for m in s.machines()] == [new_node]
    no_key_in_logs(s)
