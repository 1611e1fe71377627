"""A network neighbour against the ports: whatever it holds, the API server's next admission is answered.

Each case runs the shared transport (``common/``) as both services serve it, on 127.0.0.1, with the
neighbour on another loopback address (127.0.0.2) where a peer matters. No timing assertions: a
stall shows as the test's own timeout; each case checks what was answered and what was counted.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from testbed.components.harness import echo_allow, serve_handler
from testbed.components.serve import RunningService
from testbed.framework.pki import Pki
from testbed.framework.wait import wait_for

NEIGHBOUR = "127.0.0.2"
REVIEW = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}}).encode()


def metric(service: RunningService, sample: str) -> float:
    text = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))


def tls_socket(service: RunningService, source: str = "127.0.0.1") -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(service.ca_file))
    raw = socket.create_connection(("127.0.0.1", service.port), timeout=30, source_address=(source, 0))
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def post_review(sock: ssl.SSLSocket) -> bytes:
    """One review on a kept-alive connection; the whole answer."""
    sock.sendall(
        b"POST /review HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(REVIEW)}\r\n\r\n".encode()
        + REVIEW
    )
    answer = b""
    while b'"uid":"u"' not in answer and (chunk := sock.recv(65536)):
        answer += chunk
    return answer


def read_answer(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response: its headers and the body its Content-Length gives."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def closed_by_server(sock: ssl.SSLSocket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True


@pytest.fixture
def port(pki: Pki) -> Iterator[RunningService]:
    running = serve_handler(
        echo_allow,
        pki,
        max_body_bytes=1024 * 1024,
        read_timeout_seconds=10.0,
        max_connections=8,
        max_connections_per_peer=6,
        body_budget=2 * 1024 * 1024,
    )
    yield running
    running.stop()


def test_idle_keep_alive_connections_make_room_for_the_api_server(port: RunningService) -> None:
    with ExitStack() as stack:
        # Two neighbours hold the whole cap with kept-alive connections, each used once, now idle.
        held = [stack.enter_context(tls_socket(port, source)) for source in (NEIGHBOUR, "127.0.0.3") for _ in range(4)]
        for sock in held:
            assert post_review(sock).startswith(b"HTTP/1.1 200")
        # The API server's next admission comes on a new connection: it is served, an idle one made room.
        assert port.review("/review", {"operation": "CREATE"})["allowed"] is True
        assert metric(port, 'slime_webhook_dropped_connections_total{port="admission",reason="evicted"}') >= 1
        assert metric(port, 'slime_webhook_dropped_connections_total{port="admission",reason="connection-cap"}') == 0
        assert sum(closed_by_server(sock) for sock in held[:1]) == 1  # the longest idle one went first


def test_a_neighbour_holds_no_more_than_its_share(port: RunningService) -> None:
    with ExitStack() as stack:
        mine = [stack.enter_context(tls_socket(port, NEIGHBOUR)) for _ in range(6)]  # its share, each busy opening
        extra = stack.enter_context(tls_socket(port, NEIGHBOUR))
        assert closed_by_server(extra)
        assert metric(port, 'slime_webhook_dropped_connections_total{port="admission",reason="peer-cap"}') == 1
        assert len(mine) == 6
        assert port.review("/review", {"operation": "CREATE"})["allowed"] is True  # another peer has room


def test_connections_stalled_in_their_request_make_room_after_a_second(port: RunningService) -> None:
    with ExitStack() as stack:
        stalled = []
        for source in (NEIGHBOUR, "127.0.0.3"):
            for _ in range(4):
                sock = stack.enter_context(tls_socket(port, source))
                sock.sendall(b"POST /review HTTP/1.1\r\nHost: x\r\n")  # and nothing more
                stalled.append(sock)
        before = metric(port, 'slime_webhook_dropped_connections_total{port="admission",reason="evicted"}')

        def served() -> bool:
            # Within the first second the newcomer is refused (none is stalled long enough); then it is served.
            try:
                return port.review("/review", {"operation": "CREATE"})["allowed"] is True
            except (httpx.HTTPError, ssl.SSLError, OSError):
                return False

        wait_for(served, 10, "an admission while every connection is stalled")
        assert metric(port, 'slime_webhook_dropped_connections_total{port="admission",reason="evicted"}') > before


def test_many_large_bodies_at_once_are_answered_503_past_the_budget_and_small_ones_still_pass(
    port: RunningService,
) -> None:
    size = 900 * 1024  # just under the 1 MiB cap
    with ExitStack() as stack:
        answers = []
        for i in range(6):
            sock = stack.enter_context(tls_socket(port, NEIGHBOUR if i % 2 else "127.0.0.3"))
            sock.sendall(
                b"POST /review HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {size}\r\n\r\n".encode()
                + b"{"  # the body never comes: each holds its declared size of the budget
            )
            answers.append(sock)
        # 2 MiB of budget: two bodies are being read, every other is refused before it is read.
        refused = 0
        for sock in answers[2:]:
            sock.settimeout(10)
            answer = read_answer(sock)
            assert answer.startswith(b"HTTP/1.1 200") and b'"code":503' in answer, answer[:200]
            assert b"reading too many request bodies" in answer
            refused += 1
        assert refused == 4
        assert metric(port, 'slime_webhook_busy_total{reason="body-budget",webhook="test"}') == 4
        # A normal review (a few kilobytes) never waits for the budget.
        assert port.review("/review", {"operation": "CREATE"})["allowed"] is True


def test_the_health_port_refuses_a_header_flood_and_closes_idle_and_surplus_connections(port: RunningService) -> None:
    with socket.create_connection(("127.0.0.1", port.metrics_port), timeout=30) as flood:
        flood.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        try:
            for _ in range(200):  # headers streamed without end: bounded at 200 x 1 KiB
                flood.sendall(b"X-Filler: " + b"a" * 1024 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answer = flood.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert answer.startswith(b"HTTP/1.1 431") or answer == b""
    assert metric(port, 'slime_webhook_dropped_connections_total{port="health",reason="headers-too-large"}') == 1
    with ExitStack() as stack:
        kept = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port.metrics_port), timeout=30))
            for _ in range(16)
        ]
        surplus = stack.enter_context(socket.create_connection(("127.0.0.1", port.metrics_port), timeout=30))
        assert surplus.recv(1) == b""  # one peer holds at most 16 of the health port's connections
        for sock in kept:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(sock).startswith(b"HTTP/1.1 200")
        # Idle after their answer, they are closed by the server (its keep-alive), not kept for ever.
        assert all(sock.recv(4096) == b"" for sock in kept)
