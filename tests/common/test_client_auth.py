"""Authenticated admission: with ``--client-ca-file`` only a client certificate from that CA gets an answer.

kube-apiserver presents its client certificate when its ``--admission-control-config-file``
says so (docs/install.md, "Authenticated admission"). Without one, or with one from another CA,
the TLS handshake fails: no AdmissionReview is read, so nothing, the key least of all, is
answered. The health and metrics port never asks for a certificate. A rotated CA file is picked
up without a restart, and then only the new CA's certificates are let in.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from certs.devcerts import CertificateAuthority, create_ca, issue_client_cert
from testbed.components.harness import echo_allow, serve_handler
from testbed.components.serve import RunningService
from testbed.framework.pki import Pki
from testbed.framework.wait import wait_for

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1"}}


def client_pair(ca: CertificateAuthority, directory: Path, name: str) -> tuple[str, str]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    issue_client_cert(ca, cert, key, "kube-apiserver-webhook-client", organization="slime")
    return str(cert), str(key)


def post(service: RunningService, cert: tuple[str, str] | None) -> httpx.Response:
    context = ssl.create_default_context(cafile=str(service.ca_file))
    if cert is not None:
        context.load_cert_chain(*cert)
    with httpx.Client(verify=context, timeout=10) as client:
        return client.post(f"{service.url}/review", json=REVIEW)


@pytest.fixture
def apiserver_ca(tmp_path: Path) -> CertificateAuthority:
    return create_ca(tmp_path / "apiserver-client-ca", common_name="kube-apiserver-client-ca")


def test_only_a_certificate_from_the_client_ca_is_answered(
    pki: Pki, tmp_path: Path, apiserver_ca: CertificateAuthority
) -> None:
    service = serve_handler(echo_allow, pki, client_ca_file=str(apiserver_ca.cert_file))
    try:
        good = client_pair(apiserver_ca, tmp_path, "apiserver")
        assert post(service, good).json()["response"]["allowed"] is True
        with pytest.raises(httpx.HTTPError):
            post(service, None)  # no certificate: the handshake fails
        other = client_pair(create_ca(tmp_path / "other-ca", common_name="someone-else"), tmp_path, "other")
        with pytest.raises(httpx.HTTPError):
            post(service, other)  # a certificate from another CA
        # The health and metrics port is unaffected.
        assert httpx.get(f"{service.metrics_url}/healthz", timeout=5).text == "ok"
        assert httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 200
    finally:
        service.stop()


def test_without_a_client_ca_no_certificate_is_asked(
    pki: Pki, tmp_path: Path, apiserver_ca: CertificateAuthority
) -> None:
    service = serve_handler(echo_allow, pki)
    try:
        assert post(service, None).json()["response"]["allowed"] is True
        assert post(service, client_pair(apiserver_ca, tmp_path, "apiserver")).json()["response"]["allowed"] is True
    finally:
        service.stop()


def test_a_rotated_client_ca_is_picked_up_without_a_restart(pki: Pki, tmp_path: Path) -> None:
    bundle = tmp_path / "mounted" / "ca.crt"
    bundle.parent.mkdir()
    old_ca = create_ca(tmp_path / "old-ca", common_name="old-client-ca")
    new_ca = create_ca(tmp_path / "new-ca", common_name="new-client-ca")
    bundle.write_bytes(old_ca.pem)
    old, new = client_pair(old_ca, tmp_path, "old"), client_pair(new_ca, tmp_path, "new")
    service = serve_handler(echo_allow, pki, poll_seconds=0.2, client_ca_file=str(bundle))
    try:
        assert post(service, old).status_code == 200
        bundle.write_bytes(new_ca.pem)  # the Secret was renewed (a new CA)

        def new_ca_in() -> bool:
            try:
                return post(service, new).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(new_ca_in, 10, "the new client CA to be used")
        with pytest.raises(httpx.HTTPError):
            post(service, old)  # the old CA's certificates are no longer let in
    finally:
        service.stop()
