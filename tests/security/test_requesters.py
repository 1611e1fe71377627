"""Who may get the key, and who may move a pool (issue 20: requester identity; docs/security.md).

Through the API, as a tenant would try it: kubemu plays kube-apiserver's admission chain for the
chart's mutating webhook (``InjectionRoute``), naming in each review the user kubemu authenticated
or the one a request impersonates, as kube-apiserver does. Only CAPM3's identity, on a stored
create, gets the join data; a server-side dry run (whoever sends it) and every other requester
are admitted without it, with a warning, a metric and an Event on the Metal3Data.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml
from kubernetes import client

from common.names import CAPM3_MANAGER_USERNAME
from kubemu import Emulator
from testbed.components.serve import RunningService
from testbed.components.services import InjectionRoute, Scaling, start_injection
from testbed.framework.objects import config_map, machine_deployment, metadata_secret, mirror
from testbed.framework.pki import Pki
from testbed.framework.reviews import deployment_request, scale_request, secret_request
from testbed.framework.wait import wait_for
from testbed.framework.world import SlurmCluster, impersonating, md_replicas, seed_metal3, seed_slinky

OPT_IN = {"slurm-controller-namespace": "slurm"}
TENANT = "system:serviceaccount:team-a:ci-robot"


@pytest.fixture
def site(
    emulator_factory: Callable[..., Emulator], pki: Pki, tmp_path: Path
) -> Iterator[tuple[Emulator, InjectionRoute]]:
    route = InjectionRoute()
    emulator = emulator_factory(admission=route)
    route.injection = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    yield emulator, route
    route.injection.stop()


def core_as(emulator: Emulator, username: str | None) -> client.CoreV1Api:
    api = emulator.api_client()
    return client.CoreV1Api(api if username is None else impersonating(api, username))


def keys_of(secret: Any) -> dict[str, Any]:
    data = secret.data if hasattr(secret, "data") else secret["data"]
    loaded: dict[str, Any] = yaml.safe_load(base64.b64decode(data["metaData"]))
    return loaded


def metric(service: RunningService, name: str) -> float:
    text = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_only_capm3_on_a_stored_create_gets_the_key(site: tuple[Emulator, InjectionRoute]) -> None:
    emulator, route = site
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    capm3 = core_as(emulator, CAPM3_MANAGER_USERNAME)
    stored = capm3.create_namespaced_secret("metal3", cast(Any, metadata_secret(data)))
    assert base64.b64decode(keys_of(stored)["slurm_key_base64"]) == slurm.key
    assert route.warnings == []


@pytest.mark.parametrize(
    ("username", "dry_run", "reason"),
    [
        (TENANT, "All", "dry-run"),  # kubectl create --dry-run=server -o yaml, as a tenant
        (CAPM3_MANAGER_USERNAME, "All", "dry-run"),  # a dry run is never stored: nobody gets the key from one
        (TENANT, None, "requester"),  # a plain create by a tenant who may create Secrets
        (None, None, "requester"),  # the cluster admin: not CAPM3 either
    ],
    ids=["tenant-dry-run", "capm3-dry-run", "tenant-create", "admin-create"],
)
def test_dry_runs_and_other_requesters_get_no_key(
    site: tuple[Emulator, InjectionRoute], username: str | None, dry_run: str | None, reason: str
) -> None:
    emulator, route = site
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    assert route.injection is not None
    before = metric(route.injection, f'slime_injection_join_data_withheld_total{{reason="{reason}"}}')
    api = core_as(emulator, username)
    answer = api.create_namespaced_secret("metal3", cast(Any, metadata_secret(data)), dry_run=dry_run)
    assert not carries_the_key(answer, slurm)
    assert set(keys_of(answer)) == {"local-hostname", "providerid"}  # stored (or answered) as sent
    assert route.warnings and route.warnings[-1].startswith("SliMe added no Slurm join data")
    assert metric(route.injection, f'slime_injection_join_data_withheld_total{{reason="{reason}"}}') == before + 1
    if dry_run:
        assert emulator.get("v1", "Secret", "metal3", "m3m-0-metadata") is None

    # A Warning Event on the (verified) Metal3Data names the requester.
    def withheld_events() -> list[dict[str, Any]]:
        return [e for e in emulator.list("v1", "Event", "metal3") if e["reason"] == "SlurmJoinDataWithheld"]

    wait_for(lambda: withheld_events(), 5, "the SlurmJoinDataWithheld Event")
    event = withheld_events()[0]
    assert event["involvedObject"]["kind"] == "Metal3Data" and event["involvedObject"]["uid"] == data["metadata"]["uid"]
    assert event["type"] == "Warning" and not carries_the_key(event, slurm)


def test_the_baremetal_operators_update_is_admitted_unchanged(site: tuple[Emulator, InjectionRoute]) -> None:
    """BMO labels the metaData Secret it consumes: an UPDATE by another identity leaving metaData as it is."""
    emulator, route = site
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    stored = core_as(emulator, CAPM3_MANAGER_USERNAME).create_namespaced_secret(
        "metal3", cast(Any, metadata_secret(data))
    )
    bmo = core_as(emulator, "system:serviceaccount:baremetal-operator-system:baremetal-operator-controller-manager")
    labelled = bmo.patch_namespaced_secret(
        "m3m-0-metadata", "metal3", {"metadata": {"labels": {"environment.metal3.io": "baremetal"}}}
    )
    assert labelled.data == stored.data and base64.b64decode(keys_of(labelled)["slurm_key_base64"]) == slurm.key
    assert route.warnings == []


def test_a_forged_owner_costs_no_api_request_and_reveals_nothing(emulator: Emulator, pki: Pki, tmp_path: Path) -> None:
    """Names and uids from a review are checked against the caches before anything uses them."""
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    injection = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    try:
        injection.review("/mutate", secret_request(metadata_secret(data)))  # warms every cache
        wait_for(
            lambda: emulator.count_requests(verb="watch") >= emulator.count_requests(verb="list"), 5, "the watches"
        )
        before = len(emulator.requests)
        answers = []
        for forged_name, forged_uid in (
            ("no-such-data", "x"),
            (data["metadata"]["name"], "guessed"),
            ("no-such-data", "x"),
        ):
            forged = metadata_secret(data)
            forged["metadata"]["ownerReferences"][0].update(name=forged_name, uid=forged_uid)
            forged["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = "evil"  # would read evil-kubeconfig
            answers.append(injection.review("/mutate", secret_request(forged)))
        made = emulator.requests[before:]
        assert made == [], [r.path for r in made]  # no live read, no kubeconfig read
        messages = {a["status"]["message"] for a in answers}
        assert len(messages) == 1 and all(not a["allowed"] and "patch" not in a for a in answers)
        assert not any(carries_the_key(a, slurm) for a in answers) and data["metadata"]["uid"] not in json.dumps(
            answers
        )
        assert metric(injection, "slime_injection_unverified_owner_total") == 3
    finally:
        injection.stop()


def test_the_cluster_comes_from_the_metal3data_not_the_review(emulator: Emulator, pki: Pki, tmp_path: Path) -> None:
    """A genuine owner with a forged cluster label: the webhook reads no ``<forged>-kubeconfig``."""
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "evil-kubeconfig", "namespace": "metal3"},
            "data": {"value": base64.b64encode(b"apiVersion: v1\nkind: Config\n").decode()},
        }
    )
    injection = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    try:
        forged = metadata_secret(data)
        forged["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = "evil"
        answer = injection.review("/mutate", secret_request(forged))
        assert (
            answer["patchType"] == "JSONPatch"
        )  # joined to the local controller, as the Metal3Data's own cluster says
        assert not [r for r in emulator.requests if "evil" in r.query or "evil" in r.path]
    finally:
        injection.stop()


def carries_the_key(obj: Any, slurm: SlurmCluster) -> bool:
    text = json.dumps(client.ApiClient().sanitize_for_serialization(obj))
    texts = [text]
    for match in (obj.data if hasattr(obj, "data") and isinstance(obj.data, dict) else {}).values():
        texts.append(base64.b64decode(match).decode(errors="replace"))
    forms = (base64.b64encode(slurm.key).decode(), slurm.key.decode())
    return any(form in t for form in forms for t in texts)


# --- scaling: who may move a pool --------------------------------------------------------------------


@pytest.fixture
def pool(emulator: Emulator) -> Emulator:
    emulator.create(mirror("mirror-a", replicas=2, adopted_from="metal3/md-a"))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2))
    emulator.create(
        config_map({"mappings": "- {mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 100}"})
    )
    return emulator


def test_only_the_configured_requesters_may_scale_a_mapped_mirror(
    pool: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    keda = "system:serviceaccount:keda:keda-operator"
    scaling = scaling_factory(pool, scale_requesters=keda)
    request = scale_request("slime-system", "mirror-a", 3, old_replicas=2)
    assert scaling.review({**request, "userInfo": {"username": keda}})["allowed"] is True
    refused = scaling.review({**request, "userInfo": {"username": TENANT}})
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert refused["status"]["message"] == (
        f"requester {TENANT} may not scale mirror Deployment slime-system/mirror-a: only {keda} may "
        "(--scale-requesters)"
    )
    text = httpx.get(f"{scaling.running.metrics_url}/metrics", timeout=5).text
    assert f'slime_scaling_requests_by_requester_total{{requester="{keda}"}} 1.0' in text
    assert f'slime_scaling_requests_by_requester_total{{requester="{TENANT}"}} 1.0' in text


def test_without_a_restriction_anyone_the_api_server_authorized_may_scale(
    pool: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    scaling = scaling_factory(pool)
    request = scale_request("slime-system", "mirror-a", 3, old_replicas=2)
    assert scaling.review({**request, "userInfo": {"username": TENANT}})["allowed"] is True


def test_the_side_door_meets_the_same_rule(pool: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    """``kubectl patch deployment <mirror>`` of spec.replicas moves the pool as /scale does: the same requesters."""
    keda = "system:serviceaccount:keda:keda-operator"
    scaling = scaling_factory(pool, scale_requesters=keda)
    scaling.sees_mirror("slime-system", "mirror-a", 2)
    tenant = client.AppsV1Api(impersonating(pool.api_client(), TENANT))
    with pytest.raises(client.ApiException) as refused:
        tenant.patch_namespaced_deployment("mirror-a", "slime-system", {"spec": {"replicas": 2147483647}})
    assert refused.value.status == 403
    assert f"requester {TENANT} may not scale mirror Deployment slime-system/mirror-a" in str(refused.value.body)
    assert pool.get("apps/v1", "Deployment", "slime-system", "mirror-a")["spec"]["replicas"] == 2
    # An update that leaves the replicas alone is not a scale: the rule does not apply to it.
    tenant.patch_namespaced_deployment("mirror-a", "slime-system", {"metadata": {"labels": {"team": "a"}}})
    allowed = client.AppsV1Api(impersonating(pool.api_client(), keda))
    allowed.patch_namespaced_deployment("mirror-a", "slime-system", {"spec": {"replicas": 3}})
    wait_for(lambda: md_replicas(pool, "metal3", "md-a") == 3, what="the MachineDeployment following the mirror")


def test_a_side_door_scale_is_checked_like_a_scale(pool: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(pool)
    scaling.sees_mirror("slime-system", "mirror-a", 2)
    answer = scaling.review(deployment_request("slime-system", "mirror-a", 2**31, old_replicas=2))
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert answer["status"]["message"] == (
        "cannot scale MachineDeployment metal3/md-a from mirror slime-system/mirror-a: Deployment has spec.replicas "
        "2147483648, more than a Kubernetes replica count may be (2147483647)"
    )
    forged = scaling.review(deployment_request("slime-system", "mirror-a", 5, old_replicas=7))  # not the stored 2
    assert forged["allowed"] is False and forged["status"]["code"] == 409
    capped = scaling.review(deployment_request("slime-system", "mirror-a", 500, old_replicas=2))
    assert capped["allowed"] is True and capped["warnings"] == [
        "MachineDeployment metal3/md-a is capped at maxReplicas 100 (the mirror asks 500)"
    ]
