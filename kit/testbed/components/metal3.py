"""Metal3 for real: CAPM3 v1.13.2 and the baremetal-operator v0.13.2, built from the Go module proxy, run out of
cluster.

**Build.** ``stack/capm3`` and ``stack/bmo`` are small modules of ours that require
``github.com/metal3-io/cluster-api-provider-metal3`` v1.13.2 (with its ``api`` module at the same
version, which upstream's ``replace ./api`` points at) and ``github.com/metal3-io/baremetal-operator``
v0.13.2 (with its ``apis`` and ``pkg/hardwareutils`` modules); ``stack/README.md`` says which pins
differ from upstream's and why. :func:`build` compiles each manager's ``main`` once into the cache
(:func:`testbed.framework.gobuild.go_build`: keyed by version and module hash, one heavy build at a time,
progress lines; ``GONOSUMDB=github.com/metal3-io``, since the checksum database has no entry for
these modules).

**Manifests.** Each project's own install, ``kubectl kustomize config/default`` of its module zip,
applied as rendered except:

- the Deployment: its container runs here as a process (below), with the command-line flags of the
  rendered Deployment (clusterctl's ``${VAR:=default}`` variables at their defaults, as ``clusterctl``
  substitutes them) plus what running out of cluster needs;
- the webhook configurations, the webhook Services and cert-manager's Issuer and Certificate: nobody
  outside a manager's network namespace can reach its webhook server (:mod:`testbed.components.isolated`),
  so **CAPM3's and BMO's admission webhooks are off**, as CAPI's are. Lost: CAPM3's defaulting and
  validation of Metal3 objects (the tier writes complete ones) and BMO's validation of
  BareMetalHosts (BMO's controller still validates the BMC address and credentials);
- CRDs: CAPM3's conversion webhook is off too, so its CRDs are applied with ``None`` conversion
  (v1beta1 and v1beta2 served with the same fields): everything here reads and writes v1beta2,
  CAPM3 v1.13's storage version (CAPI picks it from the CRDs' ``cluster.x-k8s.io/v1beta2`` contract
  label, which the CRDs carry as rendered).

**Processes.** Each manager runs with :class:`testbed.components.isolated.IsolatedManager` (a network
namespace reaching only the API server) **as its own ServiceAccount**: a TokenRequest token of
``capm3-system/capm3-manager`` and ``baremetal-operator-system/baremetal-operator-controller-manager``
in a kubeconfig, so the ClusterRoles of their ``config/rbac`` authorize every call, and the
API server's audit log names them. ``capm3-manager`` is the identity the chart's injection webhook
gives join data to by default (``--allowed-requesters``). CAPM3 gets ``CAPM3_FAST_TRACK=false``
(its ConfigMap's default). BMO runs its fixture provisioner (no Ironic; ``--test-mode`` up to v0.13,
``-provisioner=fixture`` from v0.14, :func:`bmo_fixture_flags`; every
state change of a host is real BMO code, only the calls to Ironic are answered by the fixture)
with ``--webhook-port=0``, as upstream's ``make run-test-mode`` runs it out of cluster, and without
``--enable-leader-election`` (one replica; a missed lease renewal on two busy cores would stop it).
Shortcuts of the fixture provisioner worth knowing: one state for all hosts (power, image), so
``status.poweredOn`` of one host follows another's power changes; fixed 10 s steps while
provisioning and deprovisioning. :class:`testbed.components.ironic.HostBooter` therefore reads a
host's provisioning state and spec, never ``poweredOn``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.components.controlplane import ControlPlane
from testbed.components.isolated import IsolatedManager, json_workers_started, klog_workers_started
from testbed.framework.gobuild import go_build, module_dir
from testbed.framework.pins import BMO, CAPM3
from testbed.framework.progress import Progress, to_stderr

CAPM3_BINARY = "cluster-api-provider-metal3"  # go build names a binary after its package's last element
BMO_BINARY = "baremetal-operator"
CAPM3_NAMESPACE, CAPM3_SERVICE_ACCOUNT = "capm3-system", "capm3-manager"
BMO_NAMESPACE, BMO_SERVICE_ACCOUNT = "baremetal-operator-system", "baremetal-operator-controller-manager"
BMO_USERNAME = f"system:serviceaccount:{BMO_NAMESPACE}:{BMO_SERVICE_ACCOUNT}"
APPLIED = {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role"}
APPLIED |= {"RoleBinding", "ConfigMap"}
CLUSTERCTL_VARIABLE = re.compile(r"\$\{[A-Z0-9_]+:=([^}]*)\}")
CAPM3_CONTROLLERS = ("metal3machine", "metal3cluster", "metal3data", "metal3datatemplate")
BMO_CONTROLLERS = ("baremetalhost",)

Obj = dict[str, Any]


def bmo_fixture_flags(version: str) -> list[str]:
    """BMO's fixture provisioner (no Ironic) for BMO ``version``: ``--test-mode`` up to v0.13; v0.14 removed that flag
    (provisioners became plugins) for ``-provisioner=fixture``, the one compiled in (v0.14 ``main.go``; its
    ``make run-test-mode`` passes it). v0.14 also limits provisioning retries to 5 by default: the tier keeps it."""
    major, minor = (int(part) for part in version.removeprefix("v").split("-")[0].split(".")[:2])
    return ["--test-mode"] if (major, minor) < (0, 14) else ["-provisioner=fixture"]


@dataclass(frozen=True)
class Metal3Build:
    """The two managers and the ``config/`` trees of their module zips (CRDs, RBAC, Deployments)."""

    capm3: Path
    bmo: Path
    capm3_config: Path
    bmo_config: Path


def build(progress: Progress = to_stderr) -> Metal3Build:
    """Build both managers once (cached by version and module hash, one heavy build at a time) and find their
    manifests."""
    capm3 = go_build("capm3", "capm3", CAPM3.version, {CAPM3_BINARY: CAPM3.path}, "", progress)
    # The version stamp of BMO's Makefile (pkg/version: Raw, Commit), so its first log lines name the release.
    stamp = f"-X {BMO.path}/pkg/version.Raw={BMO.version} -X {BMO.path}/pkg/version.Commit=module-proxy"
    bmo = go_build("bmo", "bmo", BMO.version, {BMO_BINARY: BMO.path}, stamp, progress)
    return Metal3Build(capm3[CAPM3_BINARY], bmo[BMO_BINARY], module_dir(CAPM3) / "config", module_dir(BMO) / "config")


def clusterctl_defaults(text: str) -> str:
    """``${VAR:=default}`` replaced by its default, as ``clusterctl`` does when VAR is not set."""
    return CLUSTERCTL_VARIABLE.sub(lambda match: match.group(1), text)


def applied(obj: Obj) -> Obj | None:
    """One rendered object as applied here (see the module doc), or None when it is not applied."""
    if obj["kind"] not in APPLIED:
        return None
    if obj["kind"] == "CustomResourceDefinition":
        obj["spec"].pop("conversion", None)  # no conversion webhook runs: None conversion
        obj["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
    return obj


def container(manifest: list[Obj]) -> Obj:
    """The manager container of the one Deployment of a rendered install."""
    deployment = next(o for o in manifest if o["kind"] == "Deployment")
    found: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


@dataclass
class Metal3:
    """CAPM3 and BMO installed from their manifests and running as their ServiceAccounts. Stop with :meth:`stop`."""

    cp: ControlPlane
    parts: Metal3Build
    workdir: Path
    capm3: IsolatedManager | None = None
    bmo: IsolatedManager | None = None
    manifests: dict[str, list[Obj]] = field(default_factory=dict)

    def install(self, timeout: float = 120.0) -> None:
        """Apply both projects' CRDs, namespaces and RBAC (see the module doc) and wait for the CRDs."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        crds = []
        for name, config in (("capm3", self.parts.capm3_config), ("bmo", self.parts.bmo_config)):
            rendered = self.cp.kubectl("kustomize", str(config / "default"), timeout=120).stdout
            self.manifests[name] = [d for d in yaml.safe_load_all(clusterctl_defaults(rendered)) if d]
            objects = [o for o in (applied(d) for d in self.manifests[name]) if o is not None]
            # BMO's config/default leaves its namespace to config/namespace (its kustomize overlays add it).
            named = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
            used = sorted({o["metadata"]["namespace"] for o in objects if o["metadata"].get("namespace")} - named)
            missing: list[Obj] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in used]
            objects = missing + objects
            path = self.workdir / f"{name}-manifest.yaml"
            path.write_text(yaml.safe_dump_all(objects))
            # --force-conflicts: the real-Kubernetes tier's own Metal3 CRDs (CAPM3 v1.12's, slime-real-k8s) are
            # replaced.
            self.cp.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                f"--field-manager=slime-real-{name}",
                "-f",
                str(path),
                timeout=timeout,
            )
            crds += [o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"]
        self.cp.wait_established(crds, timeout)

    def token(self, namespace: str, service_account: str) -> str:
        return self.cp.api.token(namespace, service_account, seconds=24 * 3600)

    def _kubeconfig(self, namespace: str, service_account: str) -> Path:
        path = self.workdir / f"{service_account}.kubeconfig"
        return self.cp.token_kubeconfig(path, namespace, service_account, seconds=24 * 3600)

    def start(self, timeout: float | str = "controller-start") -> Metal3:
        """Start BMO, then CAPM3 (each ready once its controllers run their workers)."""
        bmo_args = [a for a in container(self.manifests["bmo"]).get("args") or [] if a != "--enable-leader-election"]
        self.bmo = IsolatedManager(
            "baremetal-operator",
            [str(self.parts.bmo), *bmo_args, *bmo_fixture_flags(BMO.version), "--webhook-port=0"],
            self.cp,
            self.workdir / "bmo",
            json_workers_started(*BMO_CONTROLLERS),
            env={
                "KUBECONFIG": str(self._kubeconfig(BMO_NAMESPACE, BMO_SERVICE_ACCOUNT)),
                "POD_NAMESPACE": BMO_NAMESPACE,
                "POD_NAME": "baremetal-operator-0",
            },
        ).start(timeout)
        capm3_dir = self.workdir / "capm3"
        self.capm3 = IsolatedManager(
            "capm3-manager",
            [
                str(self.parts.capm3),
                *(container(self.manifests["capm3"]).get("args") or []),
                f"--webhook-cert-dir={capm3_dir / 'webhook-certs'}",
            ],
            self.cp,
            capm3_dir,
            klog_workers_started(*CAPM3_CONTROLLERS),
            env={
                "KUBECONFIG": str(self._kubeconfig(CAPM3_NAMESPACE, CAPM3_SERVICE_ACCOUNT)),
                "CAPM3_FAST_TRACK": "false",
            },
        ).start(timeout)
        return self

    def stop(self) -> None:
        for manager in (self.capm3, self.bmo):
            if manager is not None:
                manager.stop()

    def logs(self) -> dict[str, str]:
        return {
            m.name: m.log.read_text(errors="replace")
            for m in (self.capm3, self.bmo)
            if m is not None and m.log.exists()
        }

    def tail(self, lines: int = 10) -> str:
        return "\n".join(f"--- {m.name} ---\n{m.tail(lines)}" for m in (self.capm3, self.bmo) if m is not None)
