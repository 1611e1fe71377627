"""Handler-only figures: the decisions and the metaData merge timed without HTTP, and one log line's cost."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.world import injection_request, review, scale_request
from testbed.framework import objects
from testbed.framework.wait import wait_for


def per_call(fn: Callable[[], Any], calls: int, warm: int = 2000) -> dict[str, float]:
    """Median and p99 of ``calls`` individually timed calls, in µs."""
    for _ in range(warm):
        fn()
    clock = time.perf_counter_ns
    samples = []
    for _ in range(calls):
        started = clock()
        fn()
        samples.append(clock() - started)
    samples.sort()
    return {
        "median_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "calls": calls,
    }


def handler_only(emu: Any, workdir: Path, secret: dict[str, Any], calls: int) -> dict[str, Any]:
    """Medians and p99 of the decisions without HTTP: injection (with and without the envelope, its merge and
    verification parse), scaling (mapped and unmapped), one admission log line."""
    results = injection_figures(emu, workdir, secret, calls)
    results.update(scaling_figures(calls))
    results["log line"] = log_line_cost(workdir, calls)
    return results


def injection_figures(emu: Any, workdir: Path, secret: dict[str, Any], calls: int) -> dict[str, Any]:
    from common.admission import decode_review, encode_review
    from common.kube import local_client
    from injection_webhook.bindings import Bindings, parse_bindings
    from injection_webhook.decision import JoinInfo, join_data, select
    from injection_webhook.decision import respond as injection_respond
    from injection_webhook.metadata import merged_metadata
    from injection_webhook.resolver import InjectionResolver
    from injection_webhook.settings import InjectionSettings
    from testbed.framework.objects import SLURM_BINDINGS

    kubeconfig = emu.write_kubeconfig(workdir / "kubeconfig-handler")
    selector = InjectionSettings.model_fields["controller_selector"].default
    resolver = InjectionResolver(
        local_client(kubeconfig), selector, 3.0, bindings=Bindings(parse_bindings(SLURM_BINDINGS))
    )
    resolver.start()
    try:
        wait_for(lambda: resolver.not_ready_reason() is None, 30, "the resolver caches", 0.1)
        request = injection_request(secret)
        selected = select(request)
        assert selected is not None
        owner = resolver.check_owner(selected).verified
        assert owner is not None and resolver.resolve(selected, owner, True).__class__.__name__ == "JoinInfo"
        before = len(emu.requests)

        def injection() -> Any:  # as the app: select, verify the owner, resolve, respond
            found = select(request)
            assert found is not None
            verified = resolver.check_owner(found).verified
            assert verified is not None
            return injection_respond(found, resolver.resolve(found, verified))

        assert injection().outcome == "patched"
        results: dict[str, Any] = {"injection": per_call(injection, calls)}
        body = review(request)

        def with_envelope() -> bytes:  # + JSON decode and envelope checks, and the JSON encode of the answer
            decoded = decode_review(body)
            found = select(decoded)
            assert found is not None
            verified = resolver.check_owner(found).verified
            assert verified is not None
            return encode_review(decoded["uid"], injection_respond(found, resolver.resolve(found, verified)))

        results["injection + envelope"] = per_call(with_envelope, calls)
        # The mutation's own parts: the metaData merge, and in it the parse that proves the result reads back
        # as the old map plus the join data (the edit is never sent unverified).
        resolution = resolver.resolve(selected, owner)
        assert isinstance(resolution, JoinInfo)
        entries = join_data(resolution)
        merged = merged_metadata(selected.encoded_metadata, entries)
        assert merged is not None
        rendered = base64.b64decode(merged).decode()
        results["metaData merge"] = per_call(lambda: merged_metadata(selected.encoded_metadata, entries), calls)
        results["verification parse"] = per_call(lambda: yaml.load(rendered, Loader=yaml.CSafeLoader), calls)
        results["injection_api_calls"] = len([c for c in emu.requests[before:] if c.verb != "watch"])
        return results
    finally:
        resolver.stop()


def scaling_figures(calls: int) -> dict[str, Any]:
    from scaling_webhook.decision import Observed, decide, scale_target
    from scaling_webhook.decision import respond as scaling_respond
    from scaling_webhook.mappings import parse_mappings

    mappings = f"- mirror: {objects.SLIME_NAMESPACE}/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"
    table = parse_mappings({"mappings": mappings}, objects.SLIME_NAMESPACE)
    mapped = scale_request("mirror-a", 3)
    unmapped = scale_request("unmapped", 3)
    observed = Observed(objects.mirror("mirror-a", replicas=1), objects.machine_deployment("md-a", "metal3"))

    def scaling() -> Any:
        mapping = scale_target(mapped, table)
        assert mapping is not None
        return scaling_respond(decide(mapped, mapping, observed))

    assert scaling().allowed and scale_target(unmapped, table) is None
    return {
        "scaling": per_call(scaling, calls),
        "scaling unmapped": per_call(lambda: scale_target(unmapped, table), calls),
    }


def log_line_cost(workdir: Path, calls: int) -> dict[str, float]:
    """One INFO admission log line as ``common.webhook`` writes it, through ``JsonFormatter`` to a file."""
    import logging

    from common.logs import JsonFormatter

    logger = logging.getLogger("bench.admission")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    with (workdir / "log-line.jsonl").open("w") as sink:
        handler = logging.StreamHandler(sink)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        fields = {
            "webhook": "injection",
            "uid": "0b5c3f0e-bench",
            "decision": "patched",
            "duration_ms": 0.312,
            "kind": "Secret",
            "namespace": "metal3",
            "name": "m3m-0-metadata",
            "operation": "CREATE",
            "dry_run": False,
        }
        try:
            return per_call(lambda: logger.info("admission", extra={"fields": fields}), calls)
        finally:
            logger.removeHandler(handler)
