"""One bare-metal Slurm site for a test: real Slurm and nodes, the Kubernetes side on kubemu.

- **Slurm is real**: slurmctld and slurmrestd (:class:`testbed.components.slurm.Slurm`) on the
  host side of a bridge, with the very ``slurm.key`` the seeded Slinky key Secret holds.
- **Nodes are real slurmd processes** in network namespaces (:mod:`testbed.components.netns`), booted
  from the ``metaData`` Secret *as stored after admission* by the user-data ``docs/install.md``
  shows (:mod:`testbed.components.cloudinit`).
- **The Kubernetes side is kubemu** (the API emulator), seeded like a management cluster:
  Slinky's Controller, slurmctld pod (``hostIP`` = the bridge address slurmctld listens on) and
  NodePort Service (``nodePort`` = slurmctld's port), CAPM3's Metal3DataTemplate/Metal3Data. A
  ``metaData`` Secret is created **through the API** (the kubernetes client over HTTP); kubemu's
  admission hook sends it to the running injection webhook as kube-apiserver would
  (:class:`Admission`), applies its JSONPatch and stores the result. Against a real API server
  with the webhook registered, :meth:`SlurmSite.create_metadata_secret` would do the same with no
  change: only :class:`Admission` and the direct seeding are kubemu's.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kubemu import AdmissionAttributes, Emulator
from testbed.components.cloudinit import USER_DATA, Node, boot
from testbed.components.debian_root import SlurmRoot
from testbed.components.netns import Network
from testbed.components.services import InjectionRoute, ScaleWebhookRoute, ServingFiles, start_injection
from testbed.components.slurm import Slurm, SlurmConfig
from testbed.framework.audit import scan_logs
from testbed.framework.objects import metadata_secret
from testbed.framework.ports import free_port
from testbed.framework.world import SlurmCluster, impersonating, seed_metal3, seed_nodeport, seed_slinky

OPT_IN = {"slurm-controller-namespace": "slurm"}
METAL3_NS = "metal3"
METAL3_GROUP = "infrastructure.cluster.x-k8s.io"


class Admission(InjectionRoute):
    """kubemu's admission hook for a site: metaData Secrets to the injection webhook, ``/scale`` of mirrors to
    the scaling webhooks."""

    def __init__(self) -> None:
        super().__init__()
        self.scale: ScaleWebhookRoute | None = None

    def __call__(self, attrs: AdmissionAttributes) -> dict[str, Any] | None:
        admitted = super().__call__(attrs)
        if admitted is None and self.scale is not None:
            return self.scale(attrs)
        return admitted


@dataclass
class SlurmSite:
    emulator: Emulator
    root: SlurmRoot
    network: Network
    slurm: Slurm
    cluster: SlurmCluster
    workdir: Path
    nodes: list[Node] = field(default_factory=list)
    user_data: Path = USER_DATA  # the documented user-data every host boots with

    def api(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.emulator.api_client())

    def create_metadata_secret(
        self,
        index: int,
        hostname: str,
        machine: str | None = None,
        template: str = "workers-template",
        template_annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """CAPM3's part for one host: its Metal3Data, then its ``metaData`` Secret created through the API; the
        Secret as stored.

        The Secret is named after ``machine`` (the Metal3Machine; default: the host name), its
        ``local-hostname`` is ``hostname``: a host named after its BareMetalHost keeps its name
        from one Machine to the next, each Machine has its own Secret.
        """
        _, data = seed_metal3(
            self.emulator,
            namespace=METAL3_NS,
            template=template,
            template_labels=OPT_IN,
            template_annotations=template_annotations,
            index=index,
        )
        secret = metadata_secret(
            data, machine=machine or hostname, host=f"bmh-{index}", extra={"local-hostname": hostname}
        )
        api = self.api()
        capm3 = client.CoreV1Api(impersonating(self.emulator.api_client()))  # CAPM3 creates it as its own identity
        try:
            capm3.create_namespaced_secret(METAL3_NS, secret)  # type: ignore[arg-type]  # the client accepts a plain dict body
            stored: dict[str, Any] = api.api_client.sanitize_for_serialization(
                api.read_namespaced_secret(secret["metadata"]["name"], METAL3_NS)
            )
        finally:
            api.api_client.close()
        return stored

    @staticmethod
    def meta_data(secret: dict[str, Any]) -> dict[str, Any]:
        """The flat map in a stored ``metaData`` Secret (what cloud-init reads as ``ds.meta_data``)."""
        meta: dict[str, Any] = yaml.safe_load(base64.b64decode(secret["data"]["metaData"]))
        return meta

    def boot(self, secret: dict[str, Any], address: str | None = None) -> Node:
        """The host of ``secret`` boots: cloud-init runs the documented user-data with the Secret's metadata."""
        node = boot(
            self.root,
            self.network,
            self.meta_data(secret),
            self.workdir / "nodes",
            shared=self.slurm.shared,
            user_data=self.user_data,
            address=address,
        )
        self.nodes.append(node)
        return node

    def node_logs(self) -> dict[str, str]:
        logs = {}
        for node in self.nodes:
            for path in (node.dir / "cloud-init-output.log", node.dir / "log" / "slurmd.log"):
                if path.is_file():
                    logs[f"{node.hostname}/{path.name}"] = path.read_text(errors="replace")
        return logs

    def close(self) -> None:
        for node in self.nodes:
            if node.net.netns in self.network.nodes:
                node.power_off(self.network)


JOIN_SECONDS = 20.0


def join(site: SlurmSite, count: int, first: int = 1, timeout: float = JOIN_SECONDS) -> list[Node]:
    """Hosts ``first``..: their metaData Secrets admitted through the API, each booted from the stored Secret, each
    joined."""
    nodes = [site.boot(site.create_metadata_secret(index, f"bm-{index:03d}")) for index in range(first, first + count)]
    for node in nodes:
        node.wait_joined(site.slurm, timeout=timeout)
    return nodes


@contextmanager
def slurm_site(
    root: SlurmRoot,
    network: Network,
    emulator: Emulator,
    admission: Admission,
    pki: ServingFiles,
    workdir: Path,
    nodesets: tuple[str, ...] = (),
) -> Iterator[SlurmSite]:
    """Real slurmctld + slurmrestd with the keys of the Slinky objects seeded on ``emulator`` (slurmctld on the bridge
    at the NodePort Service's nodePort, as Slinky's pod is reached), the injection webhook admitting metaData Secrets
    through ``admission``; every host powered off, every daemon stopped and their logs scanned at the end."""
    cluster = seed_slinky(emulator, host_ip=network.host_address)
    port = free_port(30000, 32767)  # slurmctld's port is the NodePort Service's nodePort
    seed_nodeport(emulator, cluster.namespace, cluster.controller, node_port=port)
    config = SlurmConfig.slinky(root, network.host_address, port, nodesets=nodesets)
    slurm = Slurm(root, workdir / "slurm", config, slurm_key=cluster.key, jwt_key=cluster.jwt_key)
    injection = None
    site = None
    try:
        slurm.start()
        injection = start_injection(emulator.write_kubeconfig(workdir / "kubeconfig-injection"), pki)
        admission.injection = injection
        site = SlurmSite(emulator, root, network, slurm, cluster, workdir)
        yield site
    finally:
        if site is not None:
            site.close()
            scan_logs("node", site.node_logs())
        if injection is not None:
            injection.stop()
        slurm.close()
        scan_logs("slurm", slurm.logs())
