"""Memory: the injection service's RSS with many cached Metal3Data, and what its caches retain in Python."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from bench.servers import injection_command, memory, running, start_server
from testbed.framework import world
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for


def rss_for(count: int, workdir: Path, cert: Path, key: Path, templates: int | None = None) -> dict[str, Any]:
    """RSS once ready with ``count`` Metal3Data spread over ``templates`` templates (default: one each)."""
    from kubemu import Emulator

    emu = Emulator().start()
    try:
        world.seed_slinky(emu)
        templates = count if templates is None else templates
        for i in range(count):
            world.seed_metal3(
                emu, template=f"tmpl-{i % templates}", index=i, template_labels={"slurm-controller-namespace": "slurm"}
            )
        kubeconfig = emu.write_kubeconfig(workdir / f"kubeconfig-rss-{count}")
        port, metrics = free_port(), free_port()
        server = start_server(
            f"injection-rss-{count}",
            injection_command(port, metrics, cert, key, kubeconfig),
            f"https://127.0.0.1:{port}/mutate",
            workdir,
        )
        try:
            started = time.monotonic()
            wait_for(
                running(server, lambda: httpx.get(f"http://127.0.0.1:{metrics}/readyz", timeout=5).status_code == 200),
                120,
                f"the injection service with {count} Metal3Data",
                0.1,
            )
            ready_after = time.monotonic() - started
            time.sleep(1.0)
            values = memory(server.process.pid)
        finally:
            server.stop()
        retained, retained_peak = retained_by_caches(kubeconfig)
    finally:
        emu.stop()
    return {
        "metal3data": count,
        "templates": templates,
        "rss_mib": round(values["VmRSS"], 1),
        "peak_rss_mib": round(values["VmHWM"], 1),
        "ready_s": round(ready_after, 2),
        "traced_mib": round(retained, 1),
        "traced_peak_mib": round(retained_peak, 1),
    }


def retained_by_caches(kubeconfig: str) -> tuple[float, float]:
    """Python memory a resolver keeps once its caches synced, and its peak (tracemalloc, after gc), in MiB.

    Runs in this process, so it counts what the caches hold without the allocator's slack, which
    RSS also contains. The first figure includes the client objects; compare across counts.
    """
    import gc
    import tracemalloc

    from common.kube import local_client
    from injection_webhook.resolver import InjectionResolver
    from injection_webhook.settings import InjectionSettings

    gc.collect()
    tracemalloc.start()
    resolver = InjectionResolver(
        local_client(kubeconfig), InjectionSettings.model_fields["controller_selector"].default, 3.0
    )
    resolver.start()
    try:
        wait_for(lambda: resolver.not_ready_reason() is None, 300, "the in-process resolver caches", 0.1)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        resolver.stop()
        tracemalloc.stop()
    return current / 2**20, peak / 2**20
