"""The node-demand rule, as a table of job mixes -> nodes, over job records shaped as slurmrestd v0.0.42 lists them."""

from __future__ import annotations

from typing import Any

import pytest

from scaling_webhook.demand import (
    DemandError,
    array_tasks,
    expand_hostlist,
    node_demand,
    parse_job,
    partition_max_nodes,
)

NOW = 1_800_000_000


def no_val(n: int | None) -> dict[str, Any]:
    """slurmrestd's UINT32_NO_VAL shape."""
    return {"set": n is not None, "infinite": False, "number": n or 0}


def job(
    state: str, nodes: int = 1, partition: str = "batch", reason: str = "None", hostlist: str = "", **extra: Any
) -> dict[str, Any]:
    states = state.split("+")
    return {
        "job_id": extra.pop("job_id", 1),
        "partition": partition,
        "job_state": states,
        "state_reason": reason,
        "node_count": no_val(nodes),
        "nodes": hostlist,
        "hold": extra.pop("hold", False),
        "eligible_time": no_val(extra.pop("eligible_time", NOW - 60)),
        **extra,
    }


CASES: list[tuple[str, list[dict[str, Any]], int]] = [
    ("nothing queued", [], 0),
    ("a pending 4-node MPI job needs 4 nodes, not 1", [job("PENDING", 4, reason="Resources")], 4),
    ("a pending job not scheduled yet (reason None) counts", [job("PENDING", 2)], 2),
    ("behind higher-priority jobs (Priority) counts", [job("PENDING", 1, reason="Priority")] * 3, 3),
    (
        "partition has fewer nodes than asked, now (PartitionNodeLimit / PartitionConfig)",
        [job("PENDING", 3, reason="PartitionNodeLimit"), job("PENDING", 2, reason="PartitionConfig")],
        5,
    ),
    (
        "nodes down or not available for it (NodeDown, ReqNodeNotAvail)",
        [job("PENDING", 1, reason="NodeDown"), job("PENDING", 1, reason="ReqNodeNotAvail")],
        2,
    ),
    (
        "running jobs: distinct allocated nodes",
        [job("RUNNING", 2, hostlist="n[1-2]"), job("RUNNING", 1, hostlist="n3")],
        3,
    ),
    (
        "two running jobs sharing a node count it once",
        [job("RUNNING", 1, hostlist="n1"), job("RUNNING", 1, hostlist="n1")],
        1,
    ),
    ("a completing job still holds its nodes", [job("COMPLETED+COMPLETING", 2, hostlist="n[1-2]")], 2),
    ("a suspended job still holds its nodes", [job("SUSPENDED", 1, hostlist="n1")], 1),
    ("finished jobs do not count", [job("COMPLETED", 2, hostlist="n[1-2]"), job("CANCELLED", 1), job("FAILED", 1)], 0),
    ("running + pending add up", [job("RUNNING", 1, hostlist="n1"), job("PENDING", 4, reason="Resources")], 5),
    ("held by the user", [job("PENDING", 2, reason="JobHeldUser", hold=True)], 0),
    ("held by an admin", [job("PENDING", 2, reason="JobHeldAdmin")], 0),
    ("hold flag alone is enough", [job("PENDING", 2, reason="None", hold=True)], 0),
    (
        "waiting on a dependency",
        [job("PENDING", 2, reason="Dependency"), job("PENDING", 1, reason="DependencyNeverSatisfied")],
        0,
    ),
    (
        "begin time in the future (eligible_time, as slurmrestd lists it)",
        [job("PENDING", 2, reason="BeginTime"), job("PENDING", 1, eligible_time=NOW + 3600)],
        0,
    ),
    ("a begin time that has passed counts", [job("PENDING", 1, reason="Priority", eligible_time=NOW - 10)], 1),
    (
        "a begin_time field (job descriptions only; never in slurmrestd's job list) is not read",
        [job("PENDING", 1, reason="Priority", begin_time=no_val(NOW + 3600))],
        1,
    ),
    (
        "association or QOS limits: nodes would not start it",
        [job("PENDING", 1, reason="AssocGrpNodeLimit"), job("PENDING", 1, reason="QOSMaxJobsPerUserLimit")],
        0,
    ),
    (
        "partition down or inactive, licenses, reservation",
        [job("PENDING", 1, reason=r) for r in ("PartitionDown", "PartitionInactive", "Licenses", "Reservation")],
        0,
    ),
    ("more nodes than the partition's MaxNodes (8) can never fit", [job("PENDING", 9, reason="PartitionNodeLimit")], 0),
    ("more nodes than the pool's maxReplicas (6) can never fit", [job("PENDING", 7, reason="Resources")], 0),
    ("another partition's jobs do not count", [job("PENDING", 4, partition="gpu", reason="Resources")], 0),
    (
        "pending in batch and gpu: counted for the first listed",
        [job("PENDING", 2, partition="batch,gpu", reason="Resources")],
        2,
    ),
    ("listed second: not here", [job("PENDING", 2, partition="gpu,batch", reason="Resources")], 0),
    ("a pending array of 10 tasks", [job("PENDING", 1, reason="Resources", array_task_string="0-9")], 10),
    ("an array limited to 3 at a time (%3)", [job("PENDING", 2, reason="Resources", array_task_string="0-9%3")], 6),
    (
        "an array limited by array_max_tasks",
        [job("PENDING", 1, reason="Resources", array_task_string="1-99:2", array_max_tasks=no_val(4))],
        4,
    ),
]


@pytest.mark.parametrize(("jobs", "nodes"), [pytest.param(jobs, nodes, id=name) for name, jobs, nodes in CASES])
def test_demand_table(jobs: list[dict[str, Any]], nodes: int) -> None:
    demand = node_demand("batch", [parse_job(j) for j in jobs], max_nodes=8, pool_max=6, now=NOW)
    assert demand.nodes == nodes


def test_what_is_ignored_is_counted_by_why() -> None:
    jobs = [
        job("PENDING", 1, reason="JobHeldUser"),
        job("PENDING", 1, reason="Dependency"),
        job("PENDING", 1, reason="BeginTime"),
        job("PENDING", 20, reason="Resources"),
        job("PENDING", 1, reason="AssocGrpNodeLimit", array_task_string="0-4"),
        job("PENDING", 2, reason="Resources"),
        job("RUNNING", 1, hostlist="n7"),
    ]
    demand = node_demand("batch", [parse_job(j) for j in jobs], max_nodes=None, pool_max=10, now=NOW)
    assert demand.as_json() == {
        "partition": "batch",
        "nodes": 3,
        "runningNodes": 1,
        "pendingNodes": 2,
        "pendingJobs": 1,
        "ignoredJobs": {"held": 1, "dependency": 1, "begin_time": 1, "never_fits": 1, "blocked": 5},
    }


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("", []),
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[08-10],cpu7", ["gpu08", "gpu09", "gpu10", "cpu7"]),
        ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
        ("slime-md-abc12", ["slime-md-abc12"]),
    ],
)
def test_host_lists(hostlist: str, names: list[str]) -> None:
    assert expand_hostlist(hostlist) == names


@pytest.mark.parametrize(
    ("hostlist", "message"),
    [
        ("n[1-3", "unbalanced"),
        ("n[a-b]", "not a number"),
        ("n[5-1]", "reversed"),
        ("n[0-9999999]", "too long"),
        ("n[[1]]", "unbalanced"),
    ],
)
def test_bad_host_lists_are_errors_not_guesses(hostlist: str, message: str) -> None:
    with pytest.raises(DemandError, match=message):
        expand_hostlist(hostlist)


def test_array_task_strings() -> None:
    assert array_tasks({}) == 1
    assert array_tasks({"array_task_string": "3,5,7-9"}) == 5
    with pytest.raises(DemandError, match="not a task range"):
        array_tasks({"job_id": 4, "array_task_string": "x"})


def test_partition_limits_from_the_partition_list() -> None:
    partitions = [
        {"name": "batch", "maximums": {"nodes": no_val(8)}},
        {"name": "gpu", "maximums": {"nodes": {"set": True, "infinite": True, "number": 0}}},
    ]
    assert partition_max_nodes(partitions, "batch") == 8
    assert partition_max_nodes(partitions, "gpu") is None  # MaxNodes=UNLIMITED
    with pytest.raises(DemandError, match="Slurm has no partition 'debug'"):
        partition_max_nodes(partitions, "debug")
