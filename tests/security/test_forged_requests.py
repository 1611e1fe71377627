"""Forged admission requests, as anyone who reaches a webhook's port can send them (docs/security.md).

Each test is one row of the attack table in docs/security.md: the attack, the control that
stops it, and the proof. Every one of them passed on the code before the security work: the
injection webhook answered a hand-written review with the key, and the scaling webhook scaled the
MachineDeployment it names.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from certs.devcerts import CertificateAuthority, create_ca, issue_client_cert
from kubemu import Emulator
from testbed.components.serve import RunningService
from testbed.components.services import Scaling, start_injection
from testbed.framework.objects import SLIME_NAMESPACE, config_map, machine_deployment, metadata_secret, mirror
from testbed.framework.pki import Pki
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.world import SlurmCluster, md_replicas, seed_metal3, seed_slinky

OPT_IN = {"slurm-controller-namespace": "slurm"}


def review(
    service: RunningService, path: str, request: dict[str, Any], cert: tuple[str, str] | None = None
) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(service.ca_file))
    if cert is not None:
        context.load_cert_chain(*cert)
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "forged", **request}}
    with httpx.Client(verify=context, timeout=10) as client:
        answer = client.post(f"{service.url}{path}", json=body)
    response: dict[str, Any] = answer.json()["response"]
    return response


def carries_the_key(response: dict[str, Any], slurm: SlurmCluster) -> bool:
    """Whether any part of an answer holds the cluster's key, raw or base64 (in a patch, a message, anywhere).

    Takes the SlurmCluster, whose repr hides the key, so a failing assert never prints it.
    """
    texts = [json.dumps(response)]
    if "patch" in response:
        operations = json.loads(base64.b64decode(response["patch"]))
        texts += [
            base64.b64decode(op["value"]).decode(errors="replace")
            for op in operations
            if isinstance(op.get("value"), str)
        ]
    forms = (base64.b64encode(slurm.key).decode(), slurm.key.decode())
    return any(form in text for form in forms for text in texts)


@pytest.fixture
def apiserver_ca(tmp_path: Path) -> CertificateAuthority:
    return create_ca(tmp_path / "apiserver-client-ca", common_name="kube-apiserver-client-ca")


def client_cert(ca: CertificateAuthority, directory: Path, name: str) -> tuple[str, str]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    issue_client_cert(ca, cert, key, "kube-apiserver-webhook-client")
    return str(cert), str(key)


# --- injection: no slurm.key oracle -------------------------------------------------------------------


def test_a_forged_review_with_a_guessed_uid_gets_no_key(emulator: Emulator, pki: Pki, tmp_path: Path) -> None:
    """Control: join data only when the owner reference's uid is the Metal3Data's (a value only its readers have)."""
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    injection = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    try:
        forged = metadata_secret(data)
        for guess in ("", "00000000-0000-0000-0000-000000000000", data["metadata"]["name"]):
            forged["metadata"]["ownerReferences"][0]["uid"] = guess
            response = review(injection, "/mutate", secret_request(forged))
            assert response["allowed"] is False and "patch" not in response
            assert "does not name a Metal3Data SliMe can verify" in response["status"]["message"]
            assert not carries_the_key(response, slurm)
            assert data["metadata"]["uid"] not in json.dumps(
                response
            )  # the answer does not give the real uid away either
    finally:
        injection.stop()


def test_with_a_client_ca_even_a_review_with_the_real_uid_gets_no_answer_without_the_apiservers_certificate(
    emulator: Emulator, pki: Pki, tmp_path: Path, apiserver_ca: CertificateAuthority
) -> None:
    """Control: authenticated admission (--client-ca-file). The residual risk without it: a reader of Metal3Data."""
    slurm = seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    injection = start_injection(
        emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki, client_ca_file=str(apiserver_ca.cert_file), ready=False
    )
    try:
        genuine = secret_request(metadata_secret(data))  # the real uid: what a reader of Metal3Data could forge
        with pytest.raises(httpx.HTTPError):
            review(injection, "/mutate", genuine)  # no client certificate
        with pytest.raises(httpx.HTTPError):
            review(
                injection, "/mutate", genuine, client_cert(create_ca(tmp_path / "other"), tmp_path, "other")
            )  # another CA
        answer = review(
            injection, "/mutate", genuine, client_cert(apiserver_ca, tmp_path, "apiserver")
        )  # kube-apiserver
        assert answer["patchType"] == "JSONPatch" and carries_the_key(answer, slurm)
    finally:
        injection.stop()


# --- scaling: no forged pool moves ----------------------------------------------------------------------


@pytest.fixture
def pool(emulator: Emulator) -> Emulator:
    emulator.create(mirror("mirror-a", replicas=5, adopted_from="metal3/md-a"))
    emulator.create(machine_deployment("md-a", "metal3", replicas=5))
    emulator.create(
        config_map({"mappings": "- {mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 20}"})
    )
    return emulator


@pytest.mark.parametrize(
    ("replicas", "old", "expected"),
    [
        (0, 5, "allowed"),  # consistent with the stored mirror: answered, but never stored, so nothing follows
        (0, 1, "denied 409"),  # an oldObject that is not the stored mirror
        (2**63, 5, "denied 400"),
        (2**31, 5, "denied 400"),
    ],
    ids=["scale-to-0", "scale-to-0-wrong-old-object", "2^63", "2^31"],
)
def test_a_forged_scale_moves_no_pool(
    pool: Emulator, scaling_factory: Callable[..., Scaling], replicas: int, old: int, expected: str
) -> None:
    """Control: the webhook never writes on admission; the leader follows only the mirror as stored."""
    scaling = scaling_factory(pool)
    response = review(
        scaling.running, "/validate", scale_request(SLIME_NAMESPACE, "mirror-a", replicas, old_replicas=old)
    )
    outcome = "allowed" if response["allowed"] else f"denied {response['status']['code']}"
    assert outcome == expected, response
    scaling.service.reconcile_once()
    assert md_replicas(pool, "metal3", "md-a") == 5


def test_with_a_client_ca_a_scale_review_without_the_apiservers_certificate_is_not_read(
    pool: Emulator, scaling_factory: Callable[..., Scaling], tmp_path: Path, apiserver_ca: CertificateAuthority
) -> None:
    scaling = scaling_factory(pool, client_ca_file=str(apiserver_ca.cert_file))
    with pytest.raises(httpx.HTTPError):
        review(scaling.running, "/validate", scale_request(SLIME_NAMESPACE, "mirror-a", 0, old_replicas=5))
    with pytest.raises(httpx.HTTPError):
        review(
            scaling.running,
            "/validate",
            scale_request(SLIME_NAMESPACE, "mirror-a", 0, old_replicas=5),
            client_cert(create_ca(tmp_path / "other"), tmp_path, "other"),
        )
    answer = review(
        scaling.running,
        "/validate",
        scale_request(SLIME_NAMESPACE, "mirror-a", 6, old_replicas=5),
        client_cert(apiserver_ca, tmp_path, "apiserver"),
    )
    assert answer["allowed"] is True
