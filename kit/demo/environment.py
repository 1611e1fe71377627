"""Everything the demo runs, up and wired: kubemu, dev PKI, both webhooks, the admission chain.

:class:`DemoEnvironment` is a context manager. On enter it renders the chart, seeds the emulator,
writes the PKI and a kubeconfig under ``workdir``, starts both webhooks over TLS on 127.0.0.1
(port 0, each with its own thread and event loop), waits until both are ready, and installs
the chart's webhook configurations as the emulator's admission chain, pointed at the local
URLs and the dev CA. On exit it stops all of it. The service logs (JSON) go to
``workdir/webhooks.log``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from certs.devcerts import CertificateAuthority, create_ca, issue_serving_cert
from common.logs import configure_logging
from demo import chart, cluster
from demo.admission_chain import AdmissionChain, point_to_local
from kubemu import Emulator
from kubemu.admission import AdmissionAttributes
from scaling_webhook.app import ScalingService
from testbed.components.serve import RunningService
from testbed.components.services import start_injection, start_scaling
from testbed.framework.errors import KitError
from testbed.framework.pki import ServingPair
from testbed.framework.ports import free_port

INJECTION_WEBHOOK = "injection.webhook.slime"
SCALING_WEBHOOK = "scaling.webhook.slime"
# How long the demo waits for any one condition (a webhook ready, the pool following, a heal).
# On an idle laptop each takes well under a second; the limit is for a machine busy with other
# work, where a thread may not run for seconds. The demo waits on conditions, never on a clock,
# so a generous limit costs nothing when all is well.
BUSY_MACHINE_SECONDS = 60.0


class DemoError(KitError):
    """A failed expectation; the message says what was expected and what happened."""


class DemoEnvironment:
    def __init__(self, workdir: Path, resync_seconds: float = 1.0, log_level: str = "INFO") -> None:
        self.workdir = workdir
        self.resync_seconds = resync_seconds
        self.log_level = log_level
        self.log_file = workdir / "webhooks.log"
        self.kubeconfig = workdir / "kubeconfig"
        self.ca: CertificateAuthority | None = None
        self.rendered: list[dict[str, Any]] = []
        self.ports: dict[str, int] = {}
        self.emulator: Emulator | None = None
        self.seeded: cluster.SeededCluster | None = None
        self.chain: AdmissionChain | None = None
        self.injection: RunningService | None = None
        self.scaling: RunningService | None = None
        self.scaling_service: ScalingService | None = None
        self._log_stream: Any = None
        self._saved_logging: tuple[list[logging.Handler], int] | None = None

    # --- the emulator's admission hook: the chain, once the webhooks are up -------------------

    def _admit(self, attrs: AdmissionAttributes) -> dict[str, Any] | None:
        chain = self.chain
        return chain(attrs) if chain is not None else None

    # --- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> DemoEnvironment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The chart is rendered with the ports the webhooks will listen on, so the release's
        # objects in kubemu (install_release) point at them.
        self.ports = {component: free_port() for component in ("injection", "scaling")}
        self.rendered = chart.render(cluster.chart_values(self.ports), cluster.SLIME_NAMESPACE)
        configurations = chart.webhook_configurations(self.rendered)
        if {c["kind"] for c in configurations} != {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}:
            raise DemoError("the rendered chart lacks a Mutating or a Validating WebhookConfiguration")

        tls = self.workdir / "tls"
        self.ca = create_ca(tls, common_name="slime-demo-ca", days=30)
        pairs = {}
        for component in ("injection", "scaling"):
            svc = f"{chart.RELEASE}-{component}-webhook"
            cert, key = tls / component / "tls.crt", tls / component / "tls.key"
            issue_serving_cert(
                self.ca,
                cert,
                key,
                [f"{svc}.{cluster.SLIME_NAMESPACE}.svc", f"{svc}.{cluster.SLIME_NAMESPACE}.svc.cluster.local"],
                ["127.0.0.1"],
                days=30,
            )
            pairs[component] = ServingPair(cert, key, self.ca.cert_file)

        self.emulator = Emulator(admission=self._admit).start()
        self._route_logs()  # after the emulator: its uvicorn config resets uvicorn's loggers
        self.seeded = cluster.seed(self.emulator, self.rendered)
        self.emulator.write_kubeconfig(self.kubeconfig)

        kubeconfig = str(self.kubeconfig)
        self.injection = start_injection(
            kubeconfig,
            pairs["injection"],
            ready_timeout=BUSY_MACHINE_SECONDS,
            port=self.ports["injection"],
            log_level=self.log_level,
            slurm_bindings=cluster.SLURM_BINDINGS,
            template_opt_ins=cluster.TEMPLATE_OPT_INS,
        )
        scaling = start_scaling(
            kubeconfig,
            pairs["scaling"],
            wait_reconciled=False,
            ready_timeout=BUSY_MACHINE_SECONDS,
            port=self.ports["scaling"],
            log_level=self.log_level,
            namespace=cluster.SLIME_NAMESPACE,
            resync_seconds=self.resync_seconds,
            patch_timeout_seconds=2,
        )
        self.scaling_service, self.scaling = scaling.service, scaling.running

        urls = {INJECTION_WEBHOOK: self.injection.url, SCALING_WEBHOOK: self.scaling.url}
        local = [point_to_local(c, urls, self.ca.pem) for c in configurations]
        self.chain = AdmissionChain(local, namespace_labels=self._namespace_labels)
        cluster.install_release(self.emulator, self.rendered, {c: tls / c for c in self.ports}, self.ca.pem)

    def _namespace_labels(self, namespace: str) -> dict[str, str] | None:
        assert self.emulator is not None
        ns = self.emulator.get("v1", "Namespace", "", namespace)
        return None if ns is None else (ns["metadata"].get("labels") or {})

    def stop(self) -> None:
        if self.chain is not None:
            self.chain.close()  # first: open keep-alive connections would delay the servers' shutdown
        for service in (self.scaling, self.injection):
            if service is not None:
                service.stop()
        self.scaling = self.injection = None
        if self.emulator is not None:
            self.emulator.stop()
        self._restore_logs()

    # --- logs: JSON into a file, so the narrative stays readable ---------------------------------

    def _route_logs(self) -> None:
        root = logging.getLogger()
        self._saved_logging = (list(root.handlers), root.level)
        self._log_stream = open(self.log_file, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        configure_logging(self.log_level, stream=self._log_stream)

    def _restore_logs(self) -> None:
        if self._saved_logging is not None:
            root = logging.getLogger()
            handlers, level = self._saved_logging
            for handler in root.handlers:
                handler.flush()
            root.handlers[:] = handlers
            root.setLevel(level)
            self._saved_logging = None
        if self._log_stream is not None:
            self._log_stream.close()
            self._log_stream = None

    # --- convenience for the story and for tests -------------------------------------------------

    def api_client(self) -> Any:
        assert self.emulator is not None
        return self.emulator.api_client()
