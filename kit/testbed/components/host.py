"""A bare-metal host of the whole-loop tier, booted by real cloud-init from its config drive.

What a provisioned Metal3 host does on its first boot, here in a network namespace of
:class:`testbed.components.netns.Network` (its ``eth0`` on the test bridge, the address of the
BareMetalHost's NIC, as DHCP would give it):

- **its disk** is the image written anew: the Slurm root with Debian's ``cloud-init``
  (:data:`PACKAGES`, :func:`testbed.components.debian_root.prepare_root`), shared by every host and never
  written, under an overlay whose upper layer is this boot's own directory. So cloud-init writes
  what it writes on a real disk (``/etc/hostname``, ``/etc/hosts``, the default user,
  ``/var/lib/cloud``, ``write_files``) and the next provisioning starts from a clean image;
- **its config drive** is the directory :func:`testbed.components.ironic.config_drive` made, at
  cloud-init's ConfigDrive seed path (``/var/lib/cloud/seed/config_drive``, read-only). Ironic
  writes the same files into an ISO 9660 partition labelled ``config-2``, which cloud-init finds
  by its label and reads the same way;
- **the image's cloud-init settings** (:data:`IMAGE_CLOUD_CFG`, written into the overlay before
  boot as an image build bakes them in): ConfigDrive is the only data source, network
  configuration is off (the namespace's ``eth0`` is already configured), and the modules that
  would act on the machine running the tests (growing partitions, resizing the root file
  system) are off. Everything else is Debian's ``/etc/cloud/cloud.cfg`` as packaged;
- **boot** runs the four stages systemd runs on a real host (``cloud-init-local``,
  ``cloud-init``, ``cloud-config``, ``cloud-final``): ``cloud-init init --local``, ``init``,
  ``modules --mode config``, ``modules --mode final``, chroot-ed into the overlay in a private
  mount and UTS namespace (cloud-init sets the host name from the metadata's ``local-hostname``).
  The user-data on the drive (the documented ``docs/cloud-init/*.yaml``, from the Machine's
  bootstrap Secret) does the rest: it writes ``slurm.key`` and starts ``slurmd -Z``, which
  daemonizes and stays in the namespace.

``/run`` and ``/var/log/slurm`` are directories of this boot (for ``slurmd.pid`` and the logs the
tests read), ``/srv/slime`` the tier's shared directory (the jobs' release files; NFS on a real
site). A power-off (:meth:`Host.power_off`) stops every process in the namespace by PID and
removes it. Nothing here dials anything: cloud-init has no network data source, and the name
service of the image is files only.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from testbed.components.cloudinit import Node
from testbed.components.debian_root import CHROOT_PATH, SlurmRoot
from testbed.components.netns import Network
from testbed.components.slurm import Slurm
from testbed.framework.processes import tail

PACKAGES = ("cloud-init",)  # added to the Slurm root the hosts boot (Debian's package: 26.2 in forky, 25.1 in trixie)
SEED = "/var/lib/cloud/seed/config_drive"
STAGES = (
    "cloud-init init --local",
    "cloud-init init",
    "cloud-init modules --mode config",
    "cloud-init modules --mode final",
)
IMAGE_CLOUD_CFG = """\
# The image's cloud-init settings (SliMe whole-loop tier: a host in a network namespace).
# Only the config drive Ironic writes; never a network data source.
datasource_list: [ConfigDrive]
# eth0 is configured before boot, as DHCP would; cloud-init must not rewrite it.
network: {config: disabled}
# The "disk" is an overlay on the test machine's file system: never grow or resize it.
growpart: {mode: "off"}
resize_rootfs: false
"""


class HostBootFailed(AssertionError):
    """cloud-init did not finish, or reported errors; the message carries its logs' ends."""


class Host(Node):
    """A booted host: ``hostname`` is its metadata's ``local-hostname`` (its Slurm node name); ``dir`` its boot's
    files."""

    @property
    def upper(self) -> Path:
        return self.dir / "disk"

    def cloud_init_result(self) -> dict[str, Any] | None:
        """cloud-init's ``result.json`` (written when the final stage ends; ``/run/cloud-init`` links to it), or
        None."""
        path = self.upper / "var/lib/cloud/data/result.json"
        try:
            loaded: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return loaded

    def cloud_init_errors(self) -> list[str]:
        result = self.cloud_init_result() or {}
        return list((result.get("v1") or {}).get("errors") or [])

    def describe(self) -> str:
        """What the boot says so far, for a timeout's message (never a key: cloud-init logs no user-data)."""
        return (
            f"{self.hostname} ({self.net.address}): cloud-init "
            f"{'finished' if self.cloud_init_result() is not None else 'not finished'}, "
            f"errors {self.cloud_init_errors()}; its output's end: "
            f"{tail(self.upper / 'var/log/cloud-init-output.log', 3)!r}; slurmd's log: {self.slurmd_log()!r}"
        )


def slurmctld_refusals(slurm: Slurm, lines: int = 3) -> list[str]:
    """slurmctld's last authentication refusals (a node with a wrong key), for a timeout's message."""
    log = slurm.logs().get("slurmctld.log", "")
    return [line for line in log.splitlines() if "authentication error" in line.lower()][-lines:]


def boot(
    root: SlurmRoot, network: Network, drive: Path, hostname: str, directory: Path, address: str, shared: Path
) -> Host:
    """Boot a host from its config drive ``drive`` (see the module doc); returns once cloud-init started."""
    parts = {name: directory / name for name in ("disk", "work", "merged", "run", "log")}
    for path in parts.values():
        path.mkdir(parents=True)
    settings = parts["disk"] / "etc/cloud/cloud.cfg.d/99-slime-image.cfg"
    settings.parent.mkdir(parents=True)
    settings.write_text(IMAGE_CLOUD_CFG)
    merged = parts["merged"]
    lines = [
        "set -e",
        f"mount -t overlay overlay -o lowerdir={root.path},upperdir={parts['disk']},workdir={parts['work']} {merged}",
        f"mount --rbind /dev {merged}/dev",
        f"mount -t proc proc {merged}/proc",
        f"mount --rbind /sys {merged}/sys",
        f"mount --bind {parts['run']} {merged}/run",
        f"mount --bind {parts['log']} {merged}/var/log/slurm",
        f"mount --bind {shared} {merged}/srv/slime",
        f"mkdir -p {merged}{SEED}",
        f"mount --bind -o ro {drive} {merged}{SEED}",
        f"exec chroot {merged} /usr/bin/env -i PATH={CHROOT_PATH} HOME=/root LANG=C.UTF-8 "
        f"/bin/sh -c {shlex.quote(' && '.join(STAGES))}",
    ]
    net = network.add(address)
    argv = [
        *net.exec_prefix(),
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        "sh",
        "-c",
        "\n".join(lines),
    ]
    with open(directory / "boot.log", "ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return Host(hostname, net, directory, process)
