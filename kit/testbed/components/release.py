"""``charts/slime`` installed with ``helm`` on the real API server, routed to webhooks on loopback.

**Routing.** kube-apiserver resolves a webhook's ``clientConfig.service`` through the Service: a
ClusterIP Service is dialled at its ClusterIP (nothing listens there on this machine, and the
tier must not dial it), an ``ExternalName`` Service at ``<externalName>:<clientConfig.service.port>``.
So after ``helm install``/``upgrade`` the two webhook Services are patched to
``type: ExternalName, externalName: localhost`` (:meth:`Release.route_to_localhost`). The
webhook configurations stay exactly as the chart rendered them: the same ``service`` reference,
the same TLS name ``<svc>.<ns>.svc`` checked against the chart-generated certificate, the same
port, which is why the chart makes the Service port equal to the container port.

Helm 4 applies objects server-side, so ``helm upgrade`` meets the patch as another field
manager's: the tier upgrades with ``--force-conflicts`` (Helm takes the Services back to the
chart's ClusterIP form) and routes them again right after. Between the two, kube-apiserver dials
each Service by its DNS name, off this machine, so nothing may call the webhooks then (the KEDA
loop's upgrade, while KEDA and the HPA scaled, once had three calls go out to the site's egress
proxy and fail open). So every scenario's release (``SiteBuilder.chart``) is made with
``routed_at_render=True``, routed by a Helm 4 post-renderer plugin instead (:func:`route_rendered`,
``python -m testbed.components.release``, installed in a plugin directory of the work directory): Helm
stores and applies the webhook Services already in their ExternalName form, so an upgrade never
turns them back (the upgrade test, ``kit/tests/real_k8s/test_upgrade.py``).

**Authenticated admission.** With ``admissionAuth.enabled`` the chart generates the client CA and
certificate (``<fullname>-apiserver-client``); :meth:`Release.admission_configuration` writes the
``AdmissionConfiguration`` and its kubeconfig (users keyed ``<svc>.<ns>.svc:<port>``, as
docs/install.md says) that kube-apiserver then gets with ``--admission-control-config-file``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.components.controlplane import ControlPlane, ControlPlaneError
from testbed.components.pods import Completed
from testbed.framework.chart import RELEASE, HelmError
from testbed.framework.errors import ApiCallFailed
from testbed.framework.helm import helm_binary
from testbed.framework.paths import CHART
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for

INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENTS = ("injection", "scaling")
HOOK_SELECTOR = "app.kubernetes.io/component=check"  # the chart's helm test Pod (slime-check)
POST_RENDERER = "slime-route-localhost"  # the Helm 4 post-renderer plugin of routed_at_render
WEBHOOK_COMPONENTS = tuple(f"{c}-webhook" for c in COMPONENTS)
# What route_to_localhost clears, and route_rendered leaves out: a ClusterIP Service's own fields.
CLUSTER_IP_FIELDS = (
    "clusterIP",
    "clusterIPs",
    "selector",
    "ipFamilies",
    "ipFamilyPolicy",
    "internalTrafficPolicy",
    "sessionAffinity",
)


def tier_values(image: str, mappings: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    """The values the tier installs with: chart-generated TLS, client-certificate admission, free ports, one pod
    each."""
    repository, _, tag = image.rpartition(":")
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "certManager": {"enabled": False},
        # The tiers play the kubelet for the webhooks' pods, not for hook Jobs: Helm makes the
        # certificates (the certgen Jobs have tests of their own, kit/tests/real_k8s/test_certgen.py).
        "selfSignedTLS": {"generator": "helm"},
        # Nor for the pre-delete teardown Job: `helm uninstall --wait` would wait for a Job no kubelet runs. The
        # teardown is tested as the command the Job runs, against kubemu (tests/lifecycle/test_teardown.py).
        "uninstall": {"enabled": False},
        "admissionAuth": {"enabled": True},
        "logLevel": "INFO",
    }
    for component in COMPONENTS:
        values[component] = {
            "replicas": 1,
            "port": free_port(),
            "metricsPort": free_port(),
            # Host network here: listen on loopback only (the services' --host, a chart value).
            "extraEnv": [{"name": "SLIME_HOST", "value": "127.0.0.1"}],
        }
    keda = bool((overrides.get("keda") or {}).get("enabled"))
    # Every pool has a ceiling: without KEDA (whose maxReplicaCount the chart takes) the tier names one.
    values["scaling"]["mappings"] = [m if keda or "maxReplicas" in m else {**m, "maxReplicas": 10} for m in mappings]
    # The tier's tenants keep their Metal3 objects in their own namespaces and take join data from the Slinky
    # Controller in the Slurm namespace: the operator's binding for every namespace.
    values["injection"]["slurmBindings"] = ["*=slurm"]
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key].update(value)
        else:
            values[key] = value
    return values


@dataclass
class Release:
    cp: ControlPlane
    namespace: str
    values: dict[str, Any]
    workdir: Path
    chart: Path = CHART
    name: str = RELEASE
    history: list[str] = field(default_factory=list)
    routed_at_render: bool = False  # the webhook Services rendered as ExternalName by a post-renderer (module doc)

    def helm(self, *args: str, timeout: float = 120.0) -> str:
        values = self.workdir / "values.json"
        values.write_text(json.dumps(self.values))
        cmd = [str(helm_binary()), *args, "--kubeconfig", str(self.cp.kubeconfig)]
        env = None
        if args[0] in ("install", "upgrade"):
            cmd += ["-f", str(values)]
            if self.routed_at_render:
                cmd += ["--post-renderer", POST_RENDERER]
                env = {**os.environ, "HELM_PLUGINS": str(post_renderer_plugins(self.workdir / "helm-plugins"))}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise HelmError(cmd, proc)
        self.history.append(" ".join(args[:2]))
        return proc.stdout

    def install(self) -> str:
        out = self.helm("install", self.name, str(self.chart), "-n", self.namespace, "--create-namespace")
        if not self.routed_at_render:
            self.route_to_localhost()
        return out

    def upgrade(self) -> str:
        # Helm 4 applies server-side: the ExternalName patch is another field manager's, so the
        # upgrade takes the Services back (--force-conflicts) and they are routed again after it.
        # routed_at_render: the rendered Services are already routed; nothing to take back.
        out = self.helm("upgrade", self.name, str(self.chart), "-n", self.namespace, "--force-conflicts")
        if not self.routed_at_render:
            self.route_to_localhost()
        return out

    def test(
        self, run_hook: Callable[[dict[str, Any]], Completed], timeout: float = 180.0
    ) -> tuple[int, str, Completed]:
        """``helm test``: Helm creates the test hook Pod and waits for its phase; ``run_hook`` plays the kubelet.

        Returns helm's exit code, its output, and what the hook's container did (exit code, log).
        """
        cmd = [str(helm_binary()), "test", self.name, "-n", self.namespace, "--kubeconfig", str(self.cp.kubeconfig)]
        cmd += ["--timeout", f"{int(timeout)}s"]
        helm = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:

            def hook_pod() -> dict[str, Any] | None:
                if helm.poll() is not None:
                    output = helm.communicate(timeout=30)[0]
                    raise ControlPlaneError(f"helm test ended before its test Pod ran: {output}")
                pods = self.cp.api.list("v1", "pods", self.namespace, HOOK_SELECTOR)
                return next((p for p in pods if _is_test(p)), None)

            pod = wait_for(hook_pod, timeout, "helm test to create its test Pod", interval=0.2)
            assert pod is not None
            completed = run_hook(pod)
            output, _ = helm.communicate(timeout=timeout)
        finally:
            if helm.poll() is None:
                helm.kill()
                helm.wait(timeout=30)
        self.history.append("test")
        return helm.returncode, output, completed

    def uninstall(self) -> str:
        return self.helm("uninstall", self.name, "-n", self.namespace, "--wait")

    def manifest(self) -> list[dict[str, Any]]:
        """The objects of the installed release, as Helm stored them."""
        out = self.helm("get", "manifest", self.name, "-n", self.namespace)
        return [d for d in yaml.safe_load_all(out) if d]

    def service_name(self, component: str) -> str:
        name: str = next(
            o["metadata"]["name"]
            for o in self.manifest()
            if o["kind"] == "Service"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == f"{component}-webhook"
        )
        return name

    def deployment(self, component: str) -> dict[str, Any]:
        return next(
            o
            for o in self.manifest()
            if o["kind"] == "Deployment"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == f"{component}-webhook"
        )

    def port(self, component: str) -> int:
        return int(self.values[component]["port"])

    def metrics_port(self, component: str) -> int:
        return int(self.values[component]["metricsPort"])

    def route_to_localhost(self) -> None:
        """Turn the two webhook Services into ExternalName ``localhost`` (see the module doc)."""
        patch = {"spec": {"type": "ExternalName", "externalName": "localhost", **dict.fromkeys(CLUSTER_IP_FIELDS)}}
        for component in COMPONENTS:
            if not self.values.get(component, {}).get("enabled", True):
                continue
            name = self.service_name(component)
            self.cp.kubectl(
                "-n",
                self.namespace,
                "patch",
                "service",
                name,
                "--type=merge",
                "-p",
                json.dumps(patch),
                "--field-manager=slime-real-k8s",
            )

    def secret_data(self, name: str) -> dict[str, bytes]:
        obj = self.cp.api.get("v1", "secrets", self.namespace, name) or {}
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    def client_certificate(self) -> dict[str, bytes]:
        """The Secret ``<fullname>-apiserver-client`` (tls.crt, tls.key, ca.crt): chart-generated, or issued by
        cert-manager.

        With ``certManager.enabled`` the chart renders a Certificate (the one with ``client auth``
        usage) instead of the Secret; its ``secretName`` holds the pair once it is issued.
        """
        auth = [
            o
            for o in self.manifest()
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "admission-auth"
        ]
        name = next((o["metadata"]["name"] for o in auth if o["kind"] == "Secret"), None)
        if name is None:
            name = next(
                o["spec"]["secretName"]
                for o in auth
                if o["kind"] == "Certificate" and "client auth" in o["spec"].get("usages", [])
            )
        return self.secret_data(name)

    def certificates(self) -> list[dict[str, Any]]:
        """The release's cert-manager Certificates as rendered (none with ``certManager.enabled=false``)."""
        return [
            o for o in self.manifest() if o["kind"] == "Certificate" and o["apiVersion"].startswith("cert-manager.io/")
        ]

    def admission_configuration(self, directory: Path) -> Path:
        """AdmissionConfiguration + kubeconfig giving kube-apiserver the chart's client certificate
        (docs/install.md)."""
        directory.mkdir(parents=True, exist_ok=True)
        client = self.client_certificate()
        users = [
            {
                "name": f"{self.service_name(c)}.{self.namespace}.svc:{self.port(c)}",
                "user": {
                    "client-certificate-data": base64.b64encode(client["tls.crt"]).decode(),
                    "client-key-data": base64.b64encode(client["tls.key"]).decode(),
                },
            }
            for c in COMPONENTS
            if self.values.get(c, {}).get("enabled", True)
        ]
        kubeconfig = directory / "webhook-kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": users}))
        kubeconfig.chmod(0o600)
        plugin = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        config = directory / "admission.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": [
                        {"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                        {"name": "MutatingAdmissionWebhook", "configuration": plugin},
                    ],
                }
            )
        )
        return config


def webhook_configurations(cp: ControlPlane, release: str) -> list[str]:
    """Names of the Mutating/ValidatingWebhookConfigurations labelled with ``release``."""
    names: list[str] = []
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        try:
            listed = cp.api.list("admissionregistration.k8s.io/v1", kind, label_selector=f"{INSTANCE_LABEL}={release}")
        except ApiCallFailed:
            continue
        names += [f"{kind}/{o['metadata']['name']}" for o in listed]
    return names


def _is_test(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"


def route_rendered(manifest: str) -> str:
    """The post-renderer of ``routed_at_render``: the two webhook Services of a rendered manifest turned into
    ``ExternalName: localhost`` (what :meth:`Release.route_to_localhost` patches); everything else as rendered."""
    documents = [d for d in yaml.safe_load_all(manifest) if d]
    for document in documents:
        labels = document.get("metadata", {}).get("labels") or {}
        if document.get("kind") == "Service" and labels.get("app.kubernetes.io/component") in WEBHOOK_COMPONENTS:
            spec = document["spec"]
            for key in CLUSTER_IP_FIELDS:
                spec.pop(key, None)
            spec.update({"type": "ExternalName", "externalName": "localhost"})
    return yaml.safe_dump_all(documents, sort_keys=False)


def post_renderer_plugins(directory: Path) -> Path:
    """A Helm 4 plugin directory (``$HELM_PLUGINS``) holding the post-renderer plugin :data:`POST_RENDERER`, which
    runs :func:`route_rendered` with this Python."""
    plugin = directory / POST_RENDERER
    plugin.mkdir(parents=True, exist_ok=True)
    spec = {
        "apiVersion": "v1",
        "type": "postrenderer/v1",
        "name": POST_RENDERER,
        "version": "0.1.0",
        "runtime": "subprocess",
        "runtimeConfig": {
            "platformCommand": [{"command": sys.executable, "args": ["-m", "testbed.components.release"]}]
        },
    }
    (plugin / "plugin.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return directory


if __name__ == "__main__":  # the post-renderer plugin's command: manifest on stdin, routed manifest on stdout
    sys.stdout.write(route_rendered(sys.stdin.read()))
