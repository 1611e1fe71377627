"""The slurmrestd client: node parsing, version probe, the JWT key read from kubemu, node calls and errors over HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.kube import KubeClient, local_client
from kubemu import Emulator
from scaling_webhook.slurm.endpoint import SlurmEndpoint
from scaling_webhook.slurm.slurmrestd import (
    JobListing,
    SlurmClient,
    SlurmNode,
    SlurmUnavailable,
    _timestamp,
    parse_node,
)
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.slurmrestd_dialects import SERVED
from testbed.framework.objects import b64
from testbed.framework.world import make_jwt_key

JWT_NS, JWT_NAME = "slurm", "slurm-jwt"

MakeClient = Callable[..., SlurmClient]


def jwt_secret(key: bytes, field: str = "jwt_hs256.key", encoded: str | None = None) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": JWT_NAME, "namespace": JWT_NS},
        "type": "Opaque",
        "data": {field: b64(key) if encoded is None else encoded},
    }


@pytest.fixture
def kube(emulator: Emulator, tmp_path: Path) -> Iterator[KubeClient]:
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JWT_NS}})
    client = local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    yield client
    client.close()


@pytest.fixture
def make_client(kube: KubeClient, slurm: FakeSlurmrestd) -> Iterator[MakeClient]:
    """A SlurmClient for the fake slurmrestd, reading its key from kubemu (``api_version`` etc. override)."""
    made: list[SlurmClient] = []

    def make(url: str | None = None, **options: object) -> SlurmClient:
        endpoint = SlurmEndpoint(url or slurm.url, (JWT_NS, JWT_NAME), **options)  # type: ignore[arg-type]
        client = SlurmClient(kube, endpoint, timeout=5.0)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# --- parsing (pure) -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "busy", "drained"),
    [
        (["IDLE"], False, False),
        (["IDLE", "DRAIN"], False, True),
        ("IDLE+DRAIN", False, True),  # the older "+"-joined string form
        (["MIXED", "DRAIN"], True, False),  # draining, not drained: a job still runs
        (["ALLOCATED"], True, False),
        (["idle", "completing", "drain"], True, False),  # case does not matter; COMPLETING is busy
        (None, False, False),
        (7, False, False),
    ],
)
def test_parse_node_states(state: object, busy: bool, drained: bool) -> None:
    node = parse_node({"name": "n1", "hostname": "h1", "address": "10.0.0.1", "state": state, "reason": "r"})
    assert (node.name, node.hostname, node.address, node.reason) == ("n1", "h1", "10.0.0.1", "r")
    assert (node.busy, node.drained) == (busy, drained)


def test_parse_node_fills_missing_fields_with_empty_strings() -> None:
    assert parse_node({"name": "n1", "hostname": None}) == SlurmNode("n1")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"set": True, "infinite": False, "number": 1700000000}, 1700000000),
        ({"set": False, "infinite": False, "number": 1700000000}, None),
        ({"set": True, "infinite": True, "number": 5}, None),
        ({"number": 42}, 42),  # "set" missing: taken as set
        (1700000000, 1700000000),
        (0, None),
        (True, None),
        ("1700000000", None),
    ],
)
def test_timestamp_shapes(value: object, expected: int | None) -> None:
    assert _timestamp(value) == expected


# --- versions --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("release", "chosen"), [("24.11", "v0.0.42"), ("26.05", "v0.0.45"), ("26.11", "v0.0.46")])
def test_the_newest_version_both_speak_is_probed_and_kept(
    kube: KubeClient, jwt_key: bytes, emulator: Emulator, release: str, chosen: str
) -> None:
    emulator.create(jwt_secret(jwt_key))
    fake = FakeSlurmrestd(jwt_key, release=release)
    client = SlurmClient(kube, SlurmEndpoint(fake.url, (JWT_NS, JWT_NAME)), timeout=5.0)
    try:
        assert client.version() == chosen
        pings = len(fake.calls)
        assert client.version() == chosen
        assert len(fake.calls) == pings, "the discovered version is cached, not probed again"
    finally:
        client.close()
        fake.stop()


def test_a_configured_version_is_used_without_probing(
    make_client: MakeClient, slurm: FakeSlurmrestd, emulator: Emulator, jwt_key: bytes
) -> None:
    emulator.create(jwt_secret(jwt_key))
    slurm.add_node("n1", "10.0.0.1")
    client = make_client(api_version="v0.0.43")
    assert [n.name for n in client.nodes()] == ["n1"]
    assert [path for _, path in slurm.calls] == ["/slurm/v0.0.43/nodes/"]


def test_a_slurmrestd_serving_no_known_version_names_each_tried(
    kube: KubeClient, jwt_key: bytes, emulator: Emulator
) -> None:
    emulator.create(jwt_secret(jwt_key))
    fake = FakeSlurmrestd(jwt_key, release="24.11", versions=("v0.0.40", "v0.0.41"))
    client = SlurmClient(kube, SlurmEndpoint(fake.url, (JWT_NS, JWT_NAME)), timeout=5.0)
    try:
        with pytest.raises(SlurmUnavailable) as error:
            client.version()
    finally:
        client.close()
        fake.stop()
    message = error.value.cause
    assert f"slurmrestd {fake.url} serves none of v0.0.46, v0.0.45, v0.0.44, v0.0.43, v0.0.42" in message
    assert "v0.0.42: " in message and "answered 404" in message


def test_a_slurmrestd_upgraded_past_the_version_in_use_is_probed_again(
    kube: KubeClient, jwt_key: bytes, emulator: Emulator
) -> None:
    """Slurm 25.11 (newest v0.0.44) is upgraded to 26.11 while SliMe runs; 27.05 will drop v0.0.43 the same way.
    The call that meets the 404 fails (no node is acted on blind); the next one probes and speaks v0.0.46."""
    emulator.create(jwt_secret(jwt_key))
    fake = FakeSlurmrestd(jwt_key, release="26.05", versions=("v0.0.42", "v0.0.43", "v0.0.44"))
    fake.add_node("n1", "10.0.0.1")
    client = SlurmClient(kube, SlurmEndpoint(fake.url, (JWT_NS, JWT_NAME)), timeout=5.0)
    try:
        assert client.version() == "v0.0.44"
        fake.versions = SERVED["26.11"]  # slurmrestd restarted as 26.11: v0.0.42 gone, v0.0.44 still served
        assert [n.name for n in client.nodes()] == ["n1"] and client.version() == "v0.0.44"
        fake.versions = ("v0.0.45", "v0.0.46")  # and later one that no longer serves v0.0.44
        with pytest.raises(SlurmUnavailable, match="answered 404 to GET /slurm/v0.0.44/nodes/"):
            client.nodes()
        assert [n.name for n in client.nodes()] == ["n1"]
        assert client.version() == "v0.0.46"
        assert fake.calls[-2:] == [("GET", "/slurm/v0.0.46/ping"), ("GET", "/slurm/v0.0.46/nodes/")]
    finally:
        client.close()
        fake.stop()


def test_a_configured_version_is_never_probed_again(
    make_client: MakeClient, slurm: FakeSlurmrestd, emulator: Emulator, jwt_key: bytes
) -> None:
    emulator.create(jwt_secret(jwt_key))
    client = make_client(api_version="v0.0.42")
    slurm.versions = SERVED["26.11"]
    for _ in range(2):
        with pytest.raises(SlurmUnavailable, match="answered 404 to GET /slurm/v0.0.42/nodes/"):
            client.nodes()
    assert not [path for _, path in slurm.calls if path.endswith("/ping")]


# --- the signing key --------------------------------------------------------------------------------


def test_a_missing_secret_is_named(make_client: MakeClient) -> None:
    with pytest.raises(SlurmUnavailable) as error:
        make_client(api_version="v0.0.45").nodes()
    assert error.value.cause.startswith(f"cannot read the JWT signing key Secret {JWT_NS}/{JWT_NAME}: 404 NotFound")


def test_a_secret_without_the_key_names_the_key(make_client: MakeClient, emulator: Emulator, jwt_key: bytes) -> None:
    emulator.create(jwt_secret(jwt_key, field="other.key"))
    with pytest.raises(SlurmUnavailable) as error:
        make_client(api_version="v0.0.45").nodes()
    assert error.value.cause == f"Secret {JWT_NS}/{JWT_NAME} has no key 'jwt_hs256.key'"


def test_a_key_that_is_not_base64_is_named_without_its_value(make_client: MakeClient, emulator: Emulator) -> None:
    # kubemu stores what it is given; a real API server would refuse it, but the client must not trust either.
    emulator.create(jwt_secret(b"", encoded="not*base64!"))
    with pytest.raises(SlurmUnavailable) as error:
        make_client(api_version="v0.0.45").nodes()
    assert error.value.cause == f"Secret {JWT_NS}/{JWT_NAME} key 'jwt_hs256.key' is not valid base64"


def test_a_missing_secret_while_probing_is_named_as_such(make_client: MakeClient) -> None:
    with pytest.raises(SlurmUnavailable) as error:
        make_client().nodes()
    assert error.value.cause.startswith(f"cannot read the JWT signing key Secret {JWT_NS}/{JWT_NAME}: 404 NotFound")


def test_tokens_carry_the_configured_user_and_a_60s_lifetime(
    make_client: MakeClient, slurm: FakeSlurmrestd, emulator: Emulator, jwt_key: bytes
) -> None:
    emulator.create(jwt_secret(jwt_key))
    make_client(token_user="slurm-admin", api_version="v0.0.45").nodes()
    (claims,) = slurm.tokens_seen
    assert claims["sun"] == "slurm-admin"
    assert claims["exp"] - claims["iat"] == 60


def test_a_rotated_key_is_read_again_after_a_refusal(
    make_client: MakeClient, slurm: FakeSlurmrestd, emulator: Emulator, jwt_key: bytes
) -> None:
    emulator.create(jwt_secret(jwt_key))
    client = make_client(api_version="v0.0.45")
    assert client.nodes() == []  # the key is read and cached
    rotated = make_jwt_key()
    emulator.patch("v1", "Secret", JWT_NS, JWT_NAME, {"data": {"jwt_hs256.key": b64(rotated)}})
    slurm.key = rotated
    emulator.clear_requests()
    assert client.nodes() == []  # 511 with the old key, then the new one from the Secret
    assert [path for _, path in slurm.calls[-2:]] == ["/slurm/v0.0.45/nodes/"] * 2
    assert emulator.count_requests(verb="get", resource="secrets") == 1


def test_a_key_slurmrestd_refuses_twice_fails_without_leaking_it(
    make_client: MakeClient, emulator: Emulator, jwt_key: bytes
) -> None:
    emulator.create(jwt_secret(make_jwt_key()))  # not the key slurmrestd verifies with
    with pytest.raises(SlurmUnavailable) as error:
        make_client(api_version="v0.0.45").nodes()
    assert error.value.cause.endswith("refused the JWT (511) twice; check jwtSecret/jwtKey/tokenUser")
    assert b64(jwt_key) not in error.value.cause and "eyJ" not in error.value.cause  # neither key nor token


# --- node calls --------------------------------------------------------------------------------------


@pytest.fixture
def ready(make_client: MakeClient, slurm: FakeSlurmrestd, emulator: Emulator, jwt_key: bytes) -> SlurmClient:
    """A client whose Secret holds the fake's key, and two idle nodes n1, n2."""
    emulator.create(jwt_secret(jwt_key))
    slurm.add_node("n1", "10.0.0.1")
    slurm.add_node("n2", "10.0.0.2", hostname="host-2")
    return make_client()


def test_nodes_are_listed_with_their_states(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    slurm.start_job("n1", end=0)
    nodes = {n.name: n for n in ready.nodes()}
    assert nodes["n1"].busy and "ALLOCATED" in nodes["n1"].states
    assert (nodes["n2"].hostname, nodes["n2"].address, nodes["n2"].busy) == ("host-2", "10.0.0.2", False)


def test_drain_then_undrain(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    ready.drain("n1", "slime: scale-in")
    (n1,) = [n for n in ready.nodes() if n.name == "n1"]
    assert n1.drained and n1.reason == "slime: scale-in"
    ready.undrain("n1")
    (n1,) = [n for n in ready.nodes() if n.name == "n1"]
    assert "DRAIN" not in n1.states
    assert (slurm.drains, slurm.undrains) == (["n1"], ["n1"])


def test_delete_says_whether_there_was_a_record(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    assert ready.delete("n1") is True
    assert ready.delete("n1") is False  # error 2018: gone already, nothing left to do
    assert slurm.deleted == ["n1"]


def test_future_keeps_the_record_and_says_whether_there_was_one(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    assert ready.future("n1") is True
    assert "n1" in slurm.future and [n.name for n in ready.nodes()] == ["n2"]
    assert ready.future("nobody") is False


@pytest.mark.parametrize("call", ["delete", "future"])
def test_a_busy_node_is_refused_with_slurms_words(ready: SlurmClient, slurm: FakeSlurmrestd, call: str) -> None:
    slurm.start_job("n1", end=0)
    with pytest.raises(SlurmUnavailable) as error:
        getattr(ready, call)("n1")
    words = "Requested nodes are busy" if call == "delete" else "Invalid node state transition"
    assert f"answered 422 to {'DELETE' if call == 'delete' else 'POST'} /slurm/v0.0.45/node/n1: " in error.value.cause
    assert words in error.value.cause
    assert "n1" in slurm.nodes, "the busy node keeps its record"


def test_a_node_name_is_quoted_in_the_path(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    assert ready.delete("a b") is False
    assert slurm.calls[-1] == ("DELETE", "/slurm/v0.0.45/node/a%20b")


def test_jobs_since_an_unchanged_listing_is_none(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    slurm.submit(2)
    first = ready.jobs()
    assert first.jobs is not None and [j["job_state"] for j in first.jobs] == [["PENDING"]]
    assert first.last_update is not None
    assert ready.jobs(since=first.last_update) == JobListing(None, first.last_update)
    slurm.submit(1)
    changed = ready.jobs(since=first.last_update)
    assert changed.jobs is not None and len(changed.jobs) == 2


# --- failures ------------------------------------------------------------------------------------------


def test_an_error_status_names_the_call_and_slurms_description(ready: SlurmClient, slurm: FakeSlurmrestd) -> None:
    ready.version()
    slurm.fail_status = 500
    with pytest.raises(SlurmUnavailable) as error:
        ready.partitions()
    assert error.value.cause == (
        f"slurmrestd {slurm.url} answered 500 to GET /slurm/v0.0.45/partitions/: injected failure (Unspecified error)"
    )


def test_an_unreachable_slurmrestd_is_named(make_client: MakeClient, emulator: Emulator, jwt_key: bytes) -> None:
    emulator.create(jwt_secret(jwt_key))
    stopped = FakeSlurmrestd(jwt_key)
    url = stopped.url
    stopped.stop()
    with pytest.raises(SlurmUnavailable) as error:
        make_client(url).version()
    assert error.value.cause.startswith(f"cannot reach slurmrestd {url}: ConnectError")
