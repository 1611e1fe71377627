"""The ``slurmHealth`` block of a mapping: defaults, the endpoint it shares, and a clear error for each bad value."""

from __future__ import annotations

import pytest

from scaling_webhook.machine_health.config import MaxUnhealthy, parse_duration
from scaling_webhook.mappings import MappingError, parse_mappings

ENDPOINT = "slurmrestd: http://slurmrestd.slurm:6820, jwtSecret: slurm/slurm-auth-jwths256"


def mapping(block: str, extra: str = "") -> str:
    head = "- mirror: slime-system/m\n  machineDeployment: metal3/md\n  maxReplicas: 10\n"
    return f"{head}{extra}  slurmHealth: {block}\n"


def parsed(block: str, extra: str = ""):  # type: ignore[no-untyped-def]
    (found,) = parse_mappings({"mappings": mapping(block, extra)}, "slime-system")
    return found.slurm_health


def test_defaults() -> None:
    config = parsed("{" + ENDPOINT + "}")
    assert config is not None
    assert (config.registration_timeout_seconds, config.unhealthy_timeout_seconds) == (900.0, 600.0)
    assert (config.remediate, config.max_unhealthy, config.slurm_user) == (False, MaxUnhealthy(percent=40), "slurm")
    assert config.jwt_secret == ("slurm", "slurm-auth-jwths256") and config.jwt_key == "jwt_hs256.key"


def test_every_setting() -> None:
    config = parsed(
        "{" + ENDPOINT + ", registrationTimeout: 20m, unhealthyTimeout: 1h30m, remediate: true, "
        "maxUnhealthy: 3, slurmUser: slurmadm}"
    )
    assert config is not None
    assert (config.registration_timeout_seconds, config.unhealthy_timeout_seconds) == (1200.0, 5400.0)
    assert (config.remediate, config.max_unhealthy.limit(100), config.slurm_user) == (True, 3, "slurmadm")


def test_the_endpoint_comes_from_safe_scale_in_when_left_out() -> None:
    config = parsed("{remediate: true}", extra="  safeScaleIn: {" + ENDPOINT + "}\n")
    assert config is not None and config.slurmrestd == "http://slurmrestd.slurm:6820"


def test_percentages_round_down_as_cluster_api_does() -> None:
    assert [MaxUnhealthy(percent=40).limit(n) for n in (1, 2, 3, 5, 10)] == [0, 0, 1, 2, 4]
    assert MaxUnhealthy(count=2).limit(1) == 2


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ("{remediate: true}", "slurmHealth: needs slurmrestd and jwtSecret"),
        ("{" + ENDPOINT + ", registrationTimeout: soon}", "registrationTimeout: 'soon' is not a duration"),
        ("{" + ENDPOINT + ", unhealthyTimeout: 0}", "unhealthyTimeout: must be longer than 0"),
        ("{" + ENDPOINT + ", remediate: 'yes'}", "remediate: must be true or false"),
        ("{" + ENDPOINT + ", maxUnhealthy: 140%}", "maxUnhealthy: '140%' is neither a count"),
        ("{" + ENDPOINT + ", maxUnhealthy: -1}", "maxUnhealthy: -1 is neither a count"),
        ("{" + ENDPOINT + ", slurmUser: 'Robert Tables'}", "slurmUser: 'Robert Tables' is not a user name"),
        ("{" + ENDPOINT + ", nodeStartupTimeout: 10m}", "unknown key(s) nodeStartupTimeout"),
        ("true", "slurmHealth: must be a map"),
    ],
)
def test_each_bad_value_is_named(block: str, words: str) -> None:
    with pytest.raises(MappingError) as caught:
        parsed(block)
    assert words in str(caught.value) and "mappings[0].slurmHealth" in str(caught.value)


def test_durations() -> None:
    assert [parse_duration(v, "x") for v in ("15m", "90s", "1h30m", "1.5h", 42, "500ms")] == [
        900.0,
        90.0,
        5400.0,
        5400.0,
        42.0,
        0.5,
    ]
    for bad in ("15", "m", "15 m", "-5m", True, ""):
        with pytest.raises(ValueError):
            parse_duration(bad, "x")
