"""The Slurm settings objects: releasedNodes parsing and the endpoint a safeScaleIn and a nodeDemand block share."""

from __future__ import annotations

import pytest

from scaling_webhook.demand import NodeDemandConfig
from scaling_webhook.safe_scale_in.config import (
    DEFAULT_RELEASED_NODES,
    RELEASED_NODES,
    SafeScaleInConfig,
    parse_released_nodes,
)
from scaling_webhook.slurm.endpoint import SLURM_API_VERSIONS, SlurmEndpoint


def test_released_nodes_default_and_values() -> None:
    assert parse_released_nodes(None, "x") == DEFAULT_RELEASED_NODES == "future"
    assert [parse_released_nodes(v, "x") for v in RELEASED_NODES] == ["future", "delete"]
    assert parse_released_nodes(" delete ", "x") == "delete"


@pytest.mark.parametrize("value", ["Delete", "keep", "", 0, ["future"]])
def test_a_bad_released_nodes_names_where_and_the_choices(value: object) -> None:
    with pytest.raises(ValueError) as error:
        parse_released_nodes(value, "mappings[2].safeScaleIn.releasedNodes")
    assert str(error.value).startswith(f"mappings[2].safeScaleIn.releasedNodes: {value!r} is not one of future, delete")


def test_versions_are_probed_newest_first() -> None:
    assert list(SLURM_API_VERSIONS) == sorted(SLURM_API_VERSIONS, key=lambda v: int(v.rsplit(".", 1)[1]), reverse=True)


def test_both_blocks_on_one_slurmrestd_share_one_endpoint() -> None:
    safe = SafeScaleInConfig("http://slurm:6820", ("slurm", "jwt"), drain_timeout_seconds=60.0, released_nodes="delete")
    demand = NodeDemandConfig("http://slurm:6820", ("slurm", "jwt"), partition="batch")
    assert safe != demand
    assert safe.endpoint == demand.endpoint == SlurmEndpoint("http://slurm:6820", ("slurm", "jwt"))
    assert type(safe.endpoint) is SlurmEndpoint
    other_user = NodeDemandConfig("http://slurm:6820", ("slurm", "jwt"), token_user="root", partition="batch")
    assert other_user.endpoint != safe.endpoint  # another Slurm user is another client
    assert len({safe.endpoint, demand.endpoint, other_user.endpoint}) == 2  # hashable: the clients are keyed by it
