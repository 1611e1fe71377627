"""Hostile load on the injection webhook: ``python3 -m bench.hostile`` (about a minute).

On the real ``injection-webhook`` process (TLS, warm caches, kubemu as the API server, the setup of
``python3 -m bench``), first alone, then while

- ``--bodies`` (50) clients keep worst-case reviews in flight: a body just under the 1 MiB cap whose
  metaData is about 700 KiB in 900 keys (the most expensive review the webhook still edits), sent
  as CAPM3 with the Metal3Data's real uid, so every one goes the whole way (decode, verification,
  the budgeted YAML walk, merge, re-parse); interleaved with nine-level YAML alias bombs and JSON
  with a 5000-digit number;
- ``--tricklers`` (50) clients trickle their request headers one byte every 0.5 s;

it measures a normal CAPM3 admission (sent back to back on its own connection) and ``GET
/healthz`` (the liveness probe) every 20 ms. Reported: their median, p99 and maximum, alone and
under load (ratios in the same run); the slowest answer to a worst-case body; how the worst-case
bodies were answered; how long the trickling clients were held. The section "Hostile load" of
docs/reliability.md is rewritten with the results.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import ssl
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.sections import replace_section
from bench.servers import REPO, InjectionBench, injection_bench, say
from bench.world import injection_request, review

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def worst_bodies(secret: dict[str, Any]) -> list[bytes]:
    big = json.loads(json.dumps(secret))
    text = base64.b64decode(secret["data"]["metaData"]).decode() + "".join(
        f"key_{i:04d}: {'v' * 780}\n" for i in range(900)
    )
    big["data"]["metaData"] = base64.b64encode(text.encode()).decode()
    bomb = json.loads(json.dumps(secret))
    bomb["data"]["metaData"] = base64.b64encode(ALIAS_BOMB.encode()).decode()
    huge = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"n","x":' + b"7" * 5000 + b"}}"
    )
    return [
        review({"uid": "worst", **injection_request(big)}),
        review({"uid": "bomb", **injection_request(bomb)}),
        huge,
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values), "p99": percentile(values, 0.99), "max": max(values), "n": len(values)}


def probe(
    url: str, context: ssl.SSLContext, health: str, body: bytes, seconds: float
) -> tuple[list[float], list[float]]:
    """Normal admissions back to back, and /healthz every 20 ms, for ``seconds``: latencies in ms."""
    admissions: list[float] = []
    probes: list[float] = []
    stop = time.monotonic() + seconds

    def admit() -> None:
        with httpx.Client(verify=context, timeout=30) as client:
            while time.monotonic() < stop:
                started = time.perf_counter()
                answer = client.post(url, content=body, headers={"Content-Type": "application/json"})
                admissions.append((time.perf_counter() - started) * 1000)
                assert answer.json()["response"]["patchType"] == "JSONPatch"

    def healthz() -> None:
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < stop:
                started = time.perf_counter()
                assert client.get(health).text == "ok"
                probes.append((time.perf_counter() - started) * 1000)
                time.sleep(0.02)

    threads = [threading.Thread(target=admit), threading.Thread(target=healthz)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return admissions, probes


def measure(bodies: int, tricklers: int, seconds: float) -> dict[str, Any]:
    with injection_bench("injection (hostile)", "slime-bench-hostile-", "--log-level", "WARNING") as bench:
        health = f"http://127.0.0.1:{bench.metrics}/healthz"
        normal = review({"uid": "normal", **injection_request(bench.secret)})
        probe(bench.server.url, bench.context, health, normal, 2.0)  # warm
        alone = probe(bench.server.url, bench.context, health, normal, seconds)
        say(f"alone: admission {summary(alone[0])}, healthz {summary(alone[1])}")
        loaded, attack = under_attack(
            bench, bodies, tricklers, lambda: probe(bench.server.url, bench.context, health, normal, max(seconds, 12.0))
        )
        results = {
            "alone": {"admission": summary(alone[0]), "healthz": summary(alone[1])},
            "loaded": {"admission": summary(loaded[0]), "healthz": summary(loaded[1])},
            **attack,
            "bodies": bodies,
            "tricklers": tricklers,
        }
        say(json.dumps(results))
        return results


def under_attack(
    bench: InjectionBench, bodies: int, tricklers: int, measure_meanwhile: Any
) -> tuple[Any, dict[str, Any]]:
    """``bodies`` clients sending the worst bodies and ``tricklers`` slow-header connections, while
    ``measure_meanwhile()`` runs; what it measured, and what the attackers saw."""
    stop = threading.Event()
    worst_ms: list[float] = []
    answers: Counter[str] = Counter()
    held: list[float] = []
    hostile = worst_bodies(bench.secret)

    def attacker(index: int) -> None:
        with httpx.Client(verify=bench.context, timeout=60) as client:
            sent = index
            while not stop.is_set():
                body = hostile[0] if sent % 5 else hostile[1 + sent % 2]  # mostly the big one
                sent += 1
                started = time.perf_counter()
                response = client.post(bench.server.url, content=body, headers={"Content-Type": "application/json"})
                worst_ms.append((time.perf_counter() - started) * 1000)
                answer = response.json()["response"]
                answers["patched" if "patch" in answer else str(answer.get("status", {}).get("code", 200))] += 1

    def trickler() -> None:
        raw = socket.create_connection(("127.0.0.1", bench.port), timeout=60)
        started = time.monotonic()
        try:
            with bench.context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
                while not stop.is_set():
                    sock.sendall(b"X")
                    time.sleep(0.5)
        except OSError:
            held.append(time.monotonic() - started)  # let go by the server

    threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(bodies)]
    threads += [threading.Thread(target=trickler, daemon=True) for _ in range(tricklers)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)  # every attacker in flight
    measured = measure_meanwhile()
    stop.set()
    for thread in threads:
        thread.join(60)
    return measured, {
        "worst_body_ms": summary(worst_ms),
        "worst_answers": dict(answers),
        "tricklers_let_go": len(held),
        "trickler_held_s": statistics.median(held) if held else None,
    }


def render(results: dict[str, Any], command: str) -> str:
    alone, loaded = results["alone"], results["loaded"]
    rows = [
        "## Hostile load",
        "",
        f"`{command}` (the machine is shared and noisy, so read the ratios). The real `injection-webhook`",
        f"process, first alone, then with {results['bodies']} clients keeping worst-case bodies in flight (a review",
        "just under the 1 MiB body cap whose metaData is 900 keys of 700 KiB, sent as CAPM3 with the real uid, so",
        "each goes the whole way; one in five an alias bomb or a 5000-digit number) and",
        f"{results['tricklers']} clients trickling their headers a byte every 0.5 s:",
        "",
        "| | alone p50 / p99 / max | under hostile load p50 / p99 / max | p99 ratio |",
        "|---|---|---|---|",
    ]
    for what, label in (("admission", "a normal CAPM3 admission"), ("healthz", "`GET /healthz`")):
        a, b = alone[what], loaded[what]
        rows.append(
            f"| {label} | {a['p50']:.1f} / {a['p99']:.1f} / {a['max']:.1f} ms | {b['p50']:.1f} / {b['p99']:.1f} / "
            f"{b['max']:.1f} ms | {b['p99'] / a['p99']:.1f}× |"
        )
    worst = results["worst_body_ms"]
    rows += [
        "",
        f"The worst-case bodies themselves: p50 {worst['p50']:.0f} ms, p99 {worst['p99']:.0f} ms, slowest "
        f"{worst['max']:.0f} ms over {worst['n']} answers "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(results['worst_answers'].items()))};",
        "503: another large review was being handled and this one could not start within 100 ms; the API server "
        "retries).",
        f"The trickling clients: {results['tricklers_let_go']} of {results['tricklers']} let go, after a median of "
        f"{results['trickler_held_s'] or 0:.1f} s (`--read-timeout-seconds` 10).",
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.hostile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bodies", type=int, default=50, help="clients keeping worst-case bodies in flight (default 50)"
    )
    parser.add_argument("--tricklers", type=int, default=50, help="clients trickling their headers (default 50)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each measurement (default 15)")
    parser.add_argument(
        "--output", default=str(REPO / "docs" / "reliability.md"), help="file to rewrite ('-': print only)"
    )
    args = parser.parse_args(argv)
    command = "python3 -m bench.hostile " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(measure(args.bodies, args.tricklers, args.seconds), command.strip())
    print(text)
    if args.output != "-":
        replace_section(Path(args.output), "hostile-load", text)
        say(f"wrote the Hostile load section of {args.output}")


if __name__ == "__main__":
    main()
