"""``slime-teardown``: leave nothing of SliMe's behind, the chart's pre-delete hook (``helm uninstall``).

In this order, so that nothing is left that blocks a write or points at nothing:

1. delete the webhook configurations (a ``Fail`` one pointing at removed pods would block every
   metaData Secret of the cluster);
2. release every pool of the scaling ConfigMap that opted into safe scale-in
   (:meth:`~scaling_webhook.safe_scale_in.service.SafeScaleIn.release_pool`): hooks and marks
   off, SliMe's drains resumed, each deleting Machine let go as soon as Slurm reports its node
   idle, waiting up to ``--wait-seconds`` for busy ones, never letting one go blindly;
3. delete the scaling webhook's Lease.

It prints one line per step and, for every Machine still held, how to finish by hand. Exit 0 when
it did everything it safely could (held Machines are reported, not failures: a failed pre-delete
hook would stop ``helm uninstall`` and leave everything in place), 1 when it could not read the
cluster or the mappings, 2 on a bad flag.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from common.apis import ADMISSION_REGISTRATION, CONFIGMAPS, LEASES
from common.events import EventRecorder
from common.kube import KubeClient, KubeConfigError, KubeError, local_client
from common.metrics import WebhookMetrics
from common.names import PRE_TERMINATE_HOOK, SCALING_COMPONENT, TEARDOWN_COMPONENT
from common.version import version_line
from scaling_webhook.errors import ScaleError
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingError, parse_mappings
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.safe_scale_in.service import PoolRelease, SafeScaleIn

POLL_SECONDS = 2.0  # how often a wait reads Slurm again: an idle node goes within two seconds


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"slime-teardown: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    command = _Parser(
        prog="slime-teardown",
        description="Take everything of SliMe's off the cluster before its release is deleted (the chart's pre-delete "
        "hook; docs/operations.md, 'Uninstalling').",
    )
    command.add_argument("--version", action="version", version=version_line("slime-teardown"))
    command.add_argument("--kubeconfig", metavar="FILE", help="[env KUBECONFIG; default: in-cluster]")
    command.add_argument(
        "--namespace", metavar="NAME", required=True, help="the release's namespace (its ConfigMap, its Lease)"
    )
    command.add_argument("--config-map", metavar="NAME", required=True, help="the scaling webhook's ConfigMap")
    command.add_argument("--lease-name", metavar="NAME", required=True, help="the scaling webhook's Lease")
    command.add_argument(
        "--mutating-webhook-configuration", metavar="NAME", default="", help="delete it first (the injection webhook)"
    )
    command.add_argument(
        "--validating-webhook-configuration", metavar="NAME", default="", help="delete it first (the scaling webhook)"
    )
    command.add_argument(
        "--wait-seconds",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="how long to wait for busy nodes to become idle before reporting what is left [default 60]",
    )
    return command


def run(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    options = parser().parse_args(argv)
    try:
        client = local_client(options.kubeconfig or os.environ.get("KUBECONFIG"), TEARDOWN_COMPONENT)
    except KubeConfigError as exc:
        out(f"FAIL cannot reach the cluster: {exc}")
        return 1
    try:
        for kind, name in (
            ("mutatingwebhookconfigurations", options.mutating_webhook_configuration),
            ("validatingwebhookconfigurations", options.validating_webhook_configuration),
        ):
            if name:
                out(_delete(client, f"{ADMISSION_REGISTRATION}/{kind}/{name}", f"{kind[:-1]} {name}"))
        try:
            pools = _safe_pools(client, options.namespace, options.config_map)
        except (KubeError, MappingError) as exc:
            out(f"FAIL cannot read the mappings in ConfigMap {options.namespace}/{options.config_map}: {exc}")
            return 1
        left = _release(client, pools, options.wait_seconds, out)
        lease = LEASES.item(options.namespace, options.lease_name)
        out(_delete(client, lease, f"Lease {options.namespace}/{options.lease_name}"))
    finally:
        client.close()
    if left:
        out(f"done, with {left} Machine(s) still held until their Slurm nodes are idle (see above)")
    else:
        out("done: nothing of SliMe's holds a Machine, and its webhooks and Lease are gone")
    return 0


def _delete(client: KubeClient, path: str, what: str) -> str:
    try:
        client.request("DELETE", path, timeout=10.0)
    except KubeError as exc:
        if exc.status == 404:
            return f"ok   {what}: already gone"
        return f"WARN {what}: not deleted ({exc}); delete it by hand"
    return f"ok   {what}: deleted"


def _safe_pools(client: KubeClient, namespace: str, config_map: str) -> list[Mapping]:
    try:
        data = client.request("GET", CONFIGMAPS.item(namespace, config_map), timeout=10.0).get("data")
    except KubeError as exc:
        if exc.status == 404:
            return []
        raise
    return [m for m in parse_mappings(data, namespace) if m.safe_scale_in is not None]


def _release(client: KubeClient, pools: list[Mapping], wait_seconds: float, out: Callable[[str], None]) -> int:
    """Release every pool, again every few seconds while busy nodes hold some, up to ``wait_seconds``."""
    metrics = ScalingMetrics(WebhookMetrics())
    scaler = MachineDeploymentScaler(client, timeout=5.0)
    events = EventRecorder(client, SCALING_COMPONENT, metrics.event_result).start()
    safe = SafeScaleIn(client, scaler, events, metrics)
    deadline = time.monotonic() + wait_seconds
    reports: dict[str, PoolRelease | str] = {}
    try:
        waiting = list(pools)
        while waiting:
            for mapping in list(waiting):
                try:
                    report = safe.release_pool(mapping)
                except ScaleError as exc:
                    reports[mapping.machine_deployment_ref] = exc.cause
                    waiting.remove(mapping)
                    continue
                reports[mapping.machine_deployment_ref] = report
                if report.done:
                    waiting.remove(mapping)
            if not waiting or time.monotonic() + POLL_SECONDS > deadline:
                break
            time.sleep(POLL_SECONDS)
            safe.reads.begin_pass()
    finally:
        events.flush(5.0)
        events.stop()
        safe.reads.close()
    left = 0
    for ref, result in reports.items():
        if isinstance(result, str):
            out(f"WARN MachineDeployment {ref}: not released ({result}); its Machines may still carry the hook")
            continue
        out(f"{'ok  ' if result.done else 'WARN'} MachineDeployment {ref}: {result.message}")
        namespace = ref.split("/")[0]
        for held in result.held:
            left += 1
            machine = held.split(" ", 1)[0]
            out(
                f"     to finish {machine} once its node is idle in Slurm (scontrol show node): kubectl -n {namespace} "
                f"annotate machine {machine} {PRE_TERMINATE_HOOK}-"
            )
    return left


def main(argv: Sequence[str] | None = None) -> None:
    raise SystemExit(run(argv))


if __name__ == "__main__":
    main()
