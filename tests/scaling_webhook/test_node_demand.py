"""Node demand end to end: the scaling service reads slurmrestd (the fake, over HTTP with a real JWT)
and serves the demand as gauges and as KEDA's metrics-api JSON; an unknown demand is never a number."""

from __future__ import annotations

import base64
from collections.abc import Callable

import httpx
import pytest

from kubemu import Emulator
from testbed.components.capi_sim import JWT_KEY, JWT_NS, JWT_SECRET, MD, MD_NS, MIRROR, demand_config
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.services import Scaling
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment, mirror
from testbed.framework.wait import wait_for

INTERVAL = {"demand_interval_seconds": 0.2}


@pytest.fixture
def world(emulator: Emulator, slurm: FakeSlurmrestd, jwt_key: bytes) -> Emulator:
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": JWT_SECRET, "namespace": JWT_NS},
            "type": "Opaque",
            "data": {JWT_KEY: base64.b64encode(jwt_key).decode()},
        }
    )
    emulator.create(mirror(MIRROR, replicas=0, adopted_from=f"{MD_NS}/{MD}"))
    emulator.create(machine_deployment(MD, MD_NS, replicas=0))
    emulator.create(demand_config(slurm.url))
    return emulator


def demand(scaling: Scaling, partition: str = "batch") -> httpx.Response:
    return httpx.get(f"{scaling.running.metrics_url}/demand/{partition}", timeout=5)


def nodes_served(scaling: Scaling, expected: int) -> dict:
    def seen() -> dict | None:
        answer = demand(scaling)
        return answer.json() if answer.status_code == 200 and answer.json()["nodes"] == expected else None

    return wait_for(seen, what=f"/demand/batch to say {expected} nodes")


def test_a_pending_four_node_job_is_a_demand_of_four_nodes(
    world: Emulator, slurm: FakeSlurmrestd, scaling_factory: Callable[..., Scaling]
) -> None:
    scaling = scaling_factory(world, **INTERVAL)
    nodes_served(scaling, 0)
    slurm.submit(4, reason="Resources")
    body = nodes_served(scaling, 4)
    assert body["runningNodes"] == 0 and body["pendingNodes"] == 4 and body["pendingJobs"] == 1
    assert scaling.metric("slime_demand_nodes", 'partition="batch"') == 4
    # Two nodes join and the job runs on them; a 3-node job waits; a held one does not count.
    slurm.pending.clear()
    slurm.add_node("node-001", "10.0.0.1")
    slurm.add_node("node-002", "10.0.0.2")
    job = slurm.start_job("node-001", end=0)
    slurm.nodes["node-002"].jobs[job] = 0
    slurm.submit(3, reason="Priority")
    slurm.submit(8, reason="JobHeldUser", hold=True)
    body = nodes_served(scaling, 5)
    assert (body["runningNodes"], body["pendingNodes"], body["ignoredJobs"]["held"]) == (2, 3, 1)
    assert scaling.metric("slime_demand_running_nodes", 'partition="batch"') == 2
    assert scaling.metric("slime_demand_ignored_jobs", 'partition="batch"') == 1
    # Every replica's answer is KEDA's metrics-api JSON: valueLocation "nodes".
    listing = httpx.get(f"{scaling.running.metrics_url}/demand", timeout=5).json()
    assert [p["partition"] for p in listing["partitions"]] == ["batch"] and listing["partitions"][0]["nodes"] == 5


def test_an_unchanged_queue_is_not_listed_again(
    world: Emulator, slurm: FakeSlurmrestd, scaling_factory: Callable[..., Scaling]
) -> None:
    """After a listing the poller asks with ``update_time`` (slurmctld's ``last_update``): while no job
    changes, slurmrestd sends no jobs and the demand is what the kept jobs say; a new job is listed again."""
    slurm.submit(4, reason="Resources")
    scaling = scaling_factory(world, **INTERVAL)
    nodes_served(scaling, 4)
    wait_for(lambda: slurm.unchanged_answers >= 3, what="polls answered 'no job changes since update_time'")
    assert any("update_time=" in path for method, path in slurm.calls if method == "GET")
    assert demand(scaling).json()["nodes"] == 4  # the kept jobs, evaluated again
    slurm.submit(2, reason="Resources")
    nodes_served(scaling, 6)


def test_an_unknown_demand_is_never_a_number(
    world: Emulator, slurm: FakeSlurmrestd, scaling_factory: Callable[..., Scaling]
) -> None:
    scaling = scaling_factory(world, **INTERVAL)
    slurm.submit(3)
    nodes_served(scaling, 3)
    slurm.fail_status = 500  # slurmctld down behind slurmrestd
    answer = wait_for(lambda: (r := demand(scaling)).status_code == 503 and r, what="a 503 while slurmrestd fails")
    assert "answered 500" in answer.json()["error"]
    wait_for(lambda: scaling.metric("slime_demand_nodes", 'partition="batch"') is None, what="the gauge withdrawn")
    slurm.fail_status = None
    nodes_served(scaling, 3)
    assert demand(scaling, "gpu").status_code == 404
    assert demand(scaling, "gpu").json()["error"] == "no mapping publishes the node demand of partition 'gpu'"


def test_a_partition_slurm_does_not_have_is_an_error_that_says_so(
    emulator: Emulator, slurm: FakeSlurmrestd, jwt_key: bytes, scaling_factory: Callable[..., Scaling]
) -> None:
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": JWT_SECRET, "namespace": JWT_NS},
            "type": "Opaque",
            "data": {JWT_KEY: base64.b64encode(jwt_key).decode()},
        }
    )
    emulator.create(demand_config(slurm.url, partition="gpu"))
    scaling = scaling_factory(emulator, **INTERVAL)
    answer = wait_for(
        lambda: (
            (r := httpx.get(f"{scaling.running.metrics_url}/demand/gpu", timeout=5)).status_code == 503
            and "Slurm has no partition" in r.text
            and r
        ),
        what="the missing partition named",
    )
    assert answer.json() == {"partition": "gpu", "error": "Slurm has no partition 'gpu'"}


def test_jobs_beyond_the_pool_or_the_partition_never_count(
    world: Emulator, slurm: FakeSlurmrestd, scaling_factory: Callable[..., Scaling]
) -> None:
    slurm.partitions["batch"] = 6  # MaxNodes=6
    world.patch(
        "v1",
        "ConfigMap",
        SLIME_NAMESPACE,
        "scaling-webhook-configmap",
        {"data": demand_config(slurm.url, max_replicas=4)["data"]},
    )
    scaling = scaling_factory(world, **INTERVAL)
    slurm.submit(7, reason="PartitionNodeLimit")  # over MaxNodes
    slurm.submit(5)  # over maxReplicas 4
    slurm.submit(4)
    body = nodes_served(scaling, 4)
    assert body["ignoredJobs"]["never_fits"] == 2
