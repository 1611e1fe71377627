"""LeaderElector against kubemu's Lease: acquire, renew, refuse, expire, release, and API failures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube import KubeClient, local_client
from kubemu import Emulator, Fault
from scaling_webhook.leader import LeaderElector, NotLeader
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.wait import wait_for

LEASE = "slime-scaling-leader"
MakeElector = Callable[..., LeaderElector]


@pytest.fixture
def kube(emulator: Emulator, tmp_path: Path) -> Iterator[KubeClient]:
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SLIME_NAMESPACE}})
    client = local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    yield client
    client.close()


@pytest.fixture
def elector(kube: KubeClient) -> MakeElector:
    def make(identity: str, **options: Any) -> LeaderElector:
        return LeaderElector(kube, SLIME_NAMESPACE, LEASE, identity=identity, **options)

    return make


def lease_spec(emulator: Emulator) -> dict[str, Any]:
    lease = emulator.get("coordination.k8s.io/v1", "Lease", SLIME_NAMESPACE, LEASE)
    assert lease is not None, "the Lease exists"
    return dict(lease["spec"])


@pytest.mark.parametrize(
    ("retry", "renew", "lease"), [(2.0, 10.0, 10.0), (10.0, 10.0, 15.0), (3.0, 2.0, 15.0), (2.0, 16.0, 15.0)]
)
def test_intervals_must_be_retry_below_renew_deadline_below_lease(
    kube: KubeClient, retry: float, renew: float, lease: float
) -> None:
    with pytest.raises(ValueError, match="need retry_seconds < renew_deadline_seconds < lease_seconds"):
        LeaderElector(
            kube, SLIME_NAMESPACE, LEASE, retry_seconds=retry, renew_deadline_seconds=renew, lease_seconds=lease
        )


def test_the_first_candidate_creates_the_lease_and_leads(elector: MakeElector, emulator: Emulator) -> None:
    changes: list[bool] = []
    a = elector("a", on_change=changes.append)
    with pytest.raises(NotLeader, match="a does not hold Lease slime-system/slime-scaling-leader \\(holder: none\\)"):
        a.ensure()
    assert a.try_acquire_or_renew() is True
    a.ensure()
    spec = lease_spec(emulator)
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("a", 15, 0)
    assert spec["acquireTime"].endswith("Z") and spec["renewTime"] == spec["acquireTime"]
    assert changes == [True]


def test_the_holder_renews_without_a_transition(elector: MakeElector, emulator: Emulator) -> None:
    a = elector("a")
    a.try_acquire_or_renew()
    acquired = lease_spec(emulator)
    wait_for(lambda: a.try_acquire_or_renew() and lease_spec(emulator)["renewTime"] != acquired["renewTime"])
    renewed = lease_spec(emulator)
    assert (renewed["acquireTime"], renewed["leaseTransitions"]) == (acquired["acquireTime"], 0)


def test_a_fresh_lease_of_another_holder_is_left_alone(elector: MakeElector, emulator: Emulator) -> None:
    elector("a").try_acquire_or_renew()
    b = elector("b")
    assert b.try_acquire_or_renew() is False
    assert b.holder == "a"
    with pytest.raises(NotLeader, match="\\(holder: a\\)"):
        b.ensure()
    assert lease_spec(emulator)["holderIdentity"] == "a"


def test_a_lease_not_renewed_for_its_duration_is_taken_over(elector: MakeElector, emulator: Emulator) -> None:
    short = {"retry_seconds": 0.05, "renew_deadline_seconds": 0.1, "lease_seconds": 0.3}
    a = elector("a", **short)
    assert a.try_acquire_or_renew()
    b = elector("b", **short)
    # b's clock starts when it first sees the record; it takes over once the record stood still a whole duration.
    wait_for(b.try_acquire_or_renew, timeout=10, what="b to take the Lease over")
    spec = lease_spec(emulator)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    wait_for(lambda: not a.is_leader, timeout=10, what="a to stop leading after its renew deadline")
    assert a.try_acquire_or_renew() is False  # b's record is fresh


def test_release_lets_a_successor_in_at_once(elector: MakeElector, emulator: Emulator) -> None:
    changes: list[bool] = []
    a = elector("a", on_change=changes.append)
    a.try_acquire_or_renew()
    a.release()
    assert not a.is_leader and changes == [True, False]
    spec = lease_spec(emulator)
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("", 1)
    b = elector("b")
    assert b.try_acquire_or_renew() is True  # an empty holder is free, no waiting
    assert lease_spec(emulator)["leaseTransitions"] == 1


def test_release_by_a_non_leader_writes_nothing(elector: MakeElector, emulator: Emulator) -> None:
    elector("a").try_acquire_or_renew()
    b = elector("b")
    b.try_acquire_or_renew()
    emulator.clear_requests()
    b.release()
    assert [r.method for r in emulator.requests] == []
    assert lease_spec(emulator)["holderIdentity"] == "a"


@pytest.mark.parametrize(("method", "status"), [("GET", 500), ("POST", 403), ("POST", 409)])
def test_an_api_failure_is_no_leadership_and_no_exception(
    elector: MakeElector, emulator: Emulator, method: str, status: int
) -> None:
    emulator.add_fault(Fault(method=method, path_regex="/leases", status=status))
    a = elector("a")
    assert a.try_acquire_or_renew() is False
    assert not a.is_leader


def test_losing_the_update_race_is_no_leadership(elector: MakeElector, emulator: Emulator) -> None:
    a = elector("a")
    a.try_acquire_or_renew()
    a.release()
    emulator.add_fault(Fault(method="PUT", path_regex="/leases/", status=409, times=1))  # another wrote first
    b = elector("b")
    assert b.try_acquire_or_renew() is False
    assert lease_spec(emulator)["holderIdentity"] == ""
    assert b.try_acquire_or_renew() is True
