"""Small hostile inputs do not stall or steer a webhook (issue 20: inputs that cannot explode, HTTP hygiene).

Transport cases run against a minimal webhook built from ``common/`` (the code both services
share); the metaData cases against the injection webhook. No timing assertions: a stall shows as
the test's own timeout, and every case checks what was answered and counted.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.admission import AdmissionResponse, allow
from kubemu import Emulator
from testbed.components.harness import echo_allow, serve_handler
from testbed.components.serve import RunningService
from testbed.components.services import start_injection
from testbed.framework.objects import b64, metadata_secret
from testbed.framework.pki import Pki
from testbed.framework.reviews import secret_request
from testbed.framework.world import seed_metal3, seed_slinky

OPT_IN = {"slurm-controller-namespace": "slurm"}


def metric(service: RunningService, line_start: str) -> float:
    text = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def tls_socket(service: RunningService) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(service.ca_file))
    raw = socket.create_connection(("127.0.0.1", service.port), timeout=30)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def closed_by_server(sock: ssl.SSLSocket) -> bool:
    """Read until the server closes the connection (b"" or a reset); False if it sends data instead."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True


@pytest.fixture
def transport(pki: Pki) -> Iterator[RunningService]:
    running = serve_handler(echo_allow, pki, max_body_bytes=64 * 1024, read_timeout_seconds=1.0, max_connections=4)
    yield running
    running.stop()


def test_a_number_python_will_not_convert_is_a_counted_400(transport: RunningService) -> None:
    body = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","n":' + b"9" * 5000 + b"}}"
    )
    answer = transport.post("/review", body)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    status = answer.json()["response"]["status"]
    assert status["code"] == 400 and status["message"].startswith("couldn't decode AdmissionReview: Exceeds the limit")
    assert metric(transport, 'slime_webhook_malformed_requests_total{code="400",webhook="test"}') == 1


def test_nan_is_not_json(transport: RunningService) -> None:
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","x":NaN}}'
    status = transport.post("/review", body).json()["response"]["status"]
    assert (status["code"], status["message"]) == (400, "couldn't decode AdmissionReview: NaN is not a JSON number")


def test_an_oversized_body_is_refused_on_its_content_length_before_it_is_sent(transport: RunningService) -> None:
    with tls_socket(transport) as sock:
        sock.sendall(
            b"POST /review HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n"
        )
        answer = b""
        while b'"code":413' not in answer and (chunk := sock.recv(65536)):  # answered with no body byte sent
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b'"code":413' in answer
    assert metric(transport, 'slime_webhook_malformed_requests_total{code="413",webhook="test"}') == 1


def test_a_client_trickling_its_headers_is_let_go(transport: RunningService) -> None:
    with tls_socket(transport) as sock:
        sock.sendall(b"POST /review HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(0.1)
        let_go = False
        for _ in range(300):  # one header byte every 0.1 s: never a whole request (bounded: 30 s)
            try:
                sock.sendall(b"X")
                if sock.recv(1) == b"":
                    let_go = True
                    break
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
                let_go = True
                break
        assert let_go
    assert metric(transport, 'slime_webhook_dropped_connections_total{port="admission",reason="slow"}') >= 1


def test_a_client_that_never_finishes_its_body_is_let_go(transport: RunningService) -> None:
    with tls_socket(transport) as sock:
        sock.sendall(
            b"POST /review HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        assert closed_by_server(sock)


def test_the_port_counts_the_connections_it_accepts_not_the_requests(transport: RunningService) -> None:
    # The counter tells an operator whether the API server reuses its connections (one TLS
    # handshake each) or pays a handshake per admission.
    before = metric(transport, 'slime_webhook_connections_total{port="admission"}')
    review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}})
    with transport.client() as kept_alive:
        for _ in range(3):
            kept_alive.post(f"{transport.url}/review", content=review, headers={"Content-Type": "application/json"})
    assert metric(transport, 'slime_webhook_connections_total{port="admission"}') == before + 1
    for _ in range(2):
        transport.post("/review", review.encode())
    assert metric(transport, 'slime_webhook_connections_total{port="admission"}') == before + 3


def test_connections_over_the_cap_are_closed_at_once_when_none_is_idle_or_stalled(
    transport: RunningService,
) -> None:
    held = [tls_socket(transport) for _ in range(4)]  # each just opened: neither idle nor stalled yet
    try:
        with tls_socket(transport) as extra:
            assert closed_by_server(extra)
        assert (
            metric(transport, 'slime_webhook_dropped_connections_total{port="admission",reason="connection-cap"}') == 1
        )
    finally:
        for sock in held:
            sock.close()


def test_headers_over_the_cap_are_refused(transport: RunningService) -> None:
    with tls_socket(transport) as sock:
        sock.sendall(b"POST /review HTTP/1.1\r\nHost: x\r\n" + b"X-Filler: " + b"a" * 70000 + b"\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431")


def test_a_handler_past_its_deadline_is_answered_and_counted(pki: Pki) -> None:
    async def slow(request: dict[str, Any]) -> AdmissionResponse:
        await asyncio.sleep(30)
        return allow()

    service = serve_handler(slow, pki, deadline_seconds=0.2)
    try:
        response = service.review("/review", {"operation": "CREATE"})
        assert response["status"]["code"] == 503 and "did not decide within 0.2s" in response["status"]["message"]
        assert metric(service, 'slime_webhook_deadline_exceeded_total{webhook="test"}') == 1
    finally:
        service.stop()


# --- the injection webhook: metaData that could explode ---------------------------------------------------

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


@pytest.fixture
def injection(emulator: Emulator, pki: Pki, tmp_path: Path) -> Iterator[tuple[RunningService, dict[str, Any]]]:
    seed_slinky(emulator)
    _, data = seed_metal3(emulator, template_labels=OPT_IN)
    service = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig"), pki)
    yield service, data
    service.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (ALIAS_BOMB, "data.metaData uses a YAML anchor (line 1); CAPM3 writes a flat map of strings"),
        (
            "a: !!python/object:os.system x\n",
            "data.metaData uses a YAML tag (line 1); CAPM3 writes a flat map of strings",
        ),
        ("a:\n  b:\n    c: d\n", "data.metaData has a nested value (line 2); CAPM3 writes a flat map of strings"),
    ],
    ids=["nine-level-alias-bomb", "tag", "nested"],
)
def test_metadata_that_could_explode_is_refused_before_any_expansion(
    injection: tuple[RunningService, dict[str, Any]], text: str, message: str
) -> None:
    service, data = injection
    secret = metadata_secret(data)
    secret["data"]["metaData"] = b64(text)
    response = service.review("/mutate", secret_request(secret))
    assert response["allowed"] is False and "patch" not in response
    assert (
        response["status"]["message"] == f"cannot inject Slurm join data into Secret metal3/m3m-0-metadata: {message}"
    )


def test_health_answers_while_large_hostile_bodies_are_in_flight(
    injection: tuple[RunningService, dict[str, Any]],
) -> None:
    """Large metaData edits run one at a time off the event loop; the probes have a loop of their own."""
    service, data = injection
    big = metadata_secret(data, extra={f"k{i:03d}": "v" * 1500 for i in range(400)})  # ~600 KiB of YAML
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "big", **secret_request(big)},
        }
    ).encode()
    answers: list[int] = []

    def send() -> None:
        answer = service.post("/mutate", body)
        answers.append(answer.json()["response"]["status"]["code"] if "status" in answer.json()["response"] else 200)

    senders = [threading.Thread(target=send) for _ in range(10)]
    for sender in senders:
        sender.start()
    health = [httpx.get(f"{service.metrics_url}/healthz", timeout=10).text for _ in range(20)]
    for sender in senders:
        sender.join(60)
    assert health == ["ok"] * 20
    # Each was edited (200, a patch) or, while another large edit ran too long, refused to retry (503).
    assert sorted(set(answers)) <= [200, 503] and len(answers) == 10 and 200 in answers
