"""Capacity-aware scale-up with real Cluster API and real BareMetalHost objects: no Machine waits for a host that
does not exist.

Two BareMetalHosts (registered with the real baremetal-operator, which makes them available); the mirror
asks 3. The scaling webhook counts the hosts CAPM3 could give the pool and holds the
MachineDeployment at 2, so CAPI creates 2 Machines and both run; a third host is enrolled, turns
``available``, and the third Machine follows. See docs/testing.md ("Real Cluster API").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.scenarios.capi import CapiParts, CapiSite, site
from testbed.scenarios.prepare import part

pytestmark = [pytest.mark.real_loop, pytest.mark.real_parts("capi"), pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def capi_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CapiSite]:
    prepared: CapiParts = part("capi")
    with site(tmp_path_factory.mktemp("capi-capacity"), prepared, hosts=2) as s:
        yield s


def test_a_scale_to_3_with_2_hosts_stops_at_2_and_the_third_follows_a_new_host(capi_site: CapiSite) -> None:
    s = capi_site
    s.wait_for(
        lambda: (
            (s.api.get("apps/v1", "Deployment", "slime-system", "mirror-a") or {}).get("spec", {}).get("replicas") == 0
        ),
        60,
        "the mirror adopted at the MachineDeployment's 0",
    )
    s.scale_mirror(3)
    s.wait_for(lambda: s.md_replicas() == 2, 60, "the MachineDeployment to follow the mirror up to the 2 hosts")
    event = s.wait_for(
        lambda: [e for e in s.events("CapacityLimited") if "asks 3" in e["message"] and "held at 2" in e["message"]],
        60,
        f"a CapacityLimited event: held at 2 (events: {[e['message'] for e in s.events('CapacityLimited')]})",
    )
    running = s.wait_for(lambda: s.provisioned_exactly(2), 240, "2 Machines Provisioned")
    names = [m["metadata"]["name"] for m in running]
    s.wait_for(
        lambda: all("IDLE" in s.slurm.node_states().get(n, set()) for n in names), 120, "both nodes to join slurmctld"
    )
    assert len(s.machines()) == 2, "no third Machine waits in Provisioning"
    assert s.md_replicas() == 2
    assert "2 available BareMetalHost(s)" in event[-1]["message"], event[-1]["message"]

    s.add_host("host-3")  # enrolled: BMO registers it and makes it available
    s.wait_for(
        lambda: s.md_replicas() == 3, 60, "the MachineDeployment to follow the mirror to 3 once a host is available"
    )
    running = s.wait_for(lambda: s.provisioned_exactly(3), 240, "3 Machines Provisioned")
    third = next(m["metadata"]["name"] for m in running if m["metadata"]["name"] not in names)
    s.wait_for(lambda: "IDLE" in s.slurm.node_states().get(third, set()), 120, f"{third} to join slurmctld")
    consumers = {
        h["metadata"]["name"]: (h["spec"].get("consumerRef") or {}).get("name")
        for h in s.api.list("metal3.io/v1alpha1", "baremetalhosts", "metal3")
    }
    assert sorted(consumers) == ["host-1", "host-2", "host-3"] and set(consumers.values()) == {
        m["metadata"]["name"] for m in running
    }
    assert s.booter.violations == []
