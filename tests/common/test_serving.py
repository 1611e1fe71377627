"""TLS serving: certificate hot-reload under load, TLS floor, health and metrics endpoints."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import httpx
import pytest

from certs.devcerts import issue_serving_cert
from testbed.components.harness import (
    Load,
    echo_allow,
    fingerprint_of,
    kubelet_volume,
    serve_handler,
    served_fingerprint,
)
from testbed.framework.pki import Pki, make_pki


def test_certificate_rotation_under_load_drops_nothing(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "issuer")
    volume = tmp_path / "volume"
    volume.mkdir()
    kubelet_volume(volume, pki, 0)
    mounted = Pki(volume, pki.ca)
    service = serve_handler(echo_allow, mounted)
    try:
        with Load(service) as load:
            for generation in range(1, 4):
                new = pki.issue()
                kubelet_volume(volume, pki, generation)
                started = time.monotonic()
                while served_fingerprint(service) != fingerprint_of(new):
                    assert time.monotonic() - started < 15, f"rotation {generation} not served within 15 s"
                    time.sleep(0.1)
            time.sleep(0.3)
        assert load.failures == [] and load.ok > 20
    finally:
        service.stop()


def test_mismatched_pair_is_rejected_and_old_certificate_keeps_serving(pki: Pki, tmp_path: Path) -> None:
    service = serve_handler(echo_allow, pki, poll_seconds=0.2)
    try:
        before = served_fingerprint(service)
        other = make_pki(tmp_path / "other")
        pki.key_file.write_bytes(other.key_file.read_bytes())  # a key that does not match the certificate
        time.sleep(1.0)
        assert served_fingerprint(service) == before
        metrics = httpx.get(f"{service.metrics_url}/metrics").text
        assert 'slime_certificate_reloads_total{result="failure"}' in metrics
        new = issue_serving_cert(pki.ca, pki.cert_file, pki.key_file, ["localhost"], ["127.0.0.1"])
        deadline = time.monotonic() + 15
        while served_fingerprint(service) != fingerprint_of(new):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        service.stop()


def test_tls_below_1_2_is_refused_and_http2_is_not_offered(pki: Pki) -> None:
    service = serve_handler(echo_allow, pki)
    try:
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.load_verify_locations(str(pki.ca_file))
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", service.port), timeout=5) as raw:
            old.wrap_socket(raw, server_hostname="127.0.0.1")
        modern = ssl.create_default_context(cafile=str(pki.ca_file))
        modern.set_alpn_protocols(["h2", "http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", service.port), timeout=5) as raw,
            modern.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.selected_alpn_protocol() == "http/1.1"
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        service.stop()


def test_health_ready_and_metrics(pki: Pki) -> None:
    service = serve_handler(echo_allow, pki)
    try:
        assert httpx.get(f"{service.metrics_url}/healthz").text == "ok"
        assert httpx.get(f"{service.metrics_url}/readyz").json() == {"ready": True}
        service.review("/review", {"operation": "CREATE"})
        metrics = httpx.get(f"{service.metrics_url}/metrics").text
        assert 'slime_webhook_requests_total{outcome="allowed",webhook="test"} 1.0' in metrics
        assert 'slime_webhook_latency_seconds_count{webhook="test"} 1.0' in metrics
        assert 'slime_webhook_requests_in_flight{webhook="test"} 0.0' in metrics
        assert "slime_certificate_expiry_timestamp_seconds" in metrics
    finally:
        service.stop()


def test_not_ready_without_certificate(tmp_path: Path, pki: Pki) -> None:
    missing = Pki(tmp_path / "empty", pki.ca)
    (tmp_path / "empty").mkdir()
    service = serve_handler(echo_allow, missing, poll_seconds=0.2)
    try:
        ready = httpx.get(f"{service.metrics_url}/readyz")
        assert ready.status_code == 503
        assert "cannot stat certificate files" in ready.json()["failed"]["certificate"]
        (tmp_path / "empty" / "tls.crt").write_bytes(pki.cert_file.read_bytes())
        (tmp_path / "empty" / "tls.key").write_bytes(pki.key_file.read_bytes())
        deadline = time.monotonic() + 10
        while httpx.get(f"{service.metrics_url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert service.review("/review", {"operation": "CREATE"})["allowed"] is True
    finally:
        service.stop()
