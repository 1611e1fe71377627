"""Boot a simulated bare-metal node as cloud-init would, from a Metal3 ``metaData`` map.

A Metal3 worker boots its image; cloud-init reads the metadata (the ``metaData`` Secret CAPM3
made and SliMe's injection webhook completed) and the user-data. User-data that starts with
``## template: jinja`` is rendered with Jinja first, with the metadata under ``ds.meta_data``
(cloud-init also offers each ``a-b`` key as ``a_b``, and renders an unknown variable as
``CI_MISSING_JINJA_VAR/<name>``). Then ``write_files`` are written and the ``runcmd`` list runs as
one ``/bin/sh`` script, each item a line.

:func:`boot` does the same on a "node": a network namespace of :class:`~testbed.components.netns.Network`
with a UTS namespace whose host name is the metadata's ``local-hostname`` (as cloud-init sets it),
running the script chroot-ed into the Slurm root, with the node's own ``/etc/slurm``, ``/run``,
spool, log and ``/var/lib/cloud`` directories. The user-data is :data:`USER_DATA`, the very file
``docs/install.md`` shows (a test checks that they match). What the node does after that (write
``slurm.key``, start ``slurmd -Z --conf-server ...``) is up to that file alone.
"""

from __future__ import annotations

import base64
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from testbed.components.debian_root import Bind, SlurmRoot, chroot_argv
from testbed.components.netns import Network, NodeNet
from testbed.components.slurm import Slurm, SlurmFailed
from testbed.framework.errors import WaitTimeout
from testbed.framework.paths import REPO_ROOT
from testbed.framework.processes import tail
from testbed.framework.wait import wait_for

USER_DATA = REPO_ROOT / "docs" / "cloud-init" / "slurm-worker.yaml"
JINJA_HEADER = "## template: jinja"
MISSING = "CI_MISSING_JINJA_VAR/"
SCRIPT = "/var/lib/cloud/instance/scripts/runcmd"


class _CloudInitUndefined(jinja2.Undefined):
    """cloud-init's UndefinedJinjaVariable: an unknown variable renders as ``CI_MISSING_JINJA_VAR/<name>``."""

    def __str__(self) -> str:
        return f"{MISSING}{self._undefined_name}"


def jinja_variables(meta_data: Mapping[str, Any]) -> dict[str, Any]:
    """The variables cloud-init gives a Jinja template: ``ds.meta_data`` (plus ``a_b`` aliases of ``a-b`` keys),
    ``v1``."""
    meta = dict(meta_data)
    for key in list(meta):
        if "-" in key:
            meta.setdefault(key.replace("-", "_"), meta[key])
    hostname = meta.get("local-hostname")
    return {"ds": {"meta_data": meta}, "v1": {"local_hostname": hostname}, "local_hostname": hostname}


def render_user_data(template: str, meta_data: Mapping[str, Any]) -> str:
    """Render user-data as cloud-init does: only with the ``## template: jinja`` first line, which it drops."""
    first, _, rest = template.partition("\n")
    if first.strip() != JINJA_HEADER:
        raise ValueError(f"user-data does not start with {JINJA_HEADER!r}: cloud-init would not render it")
    environment = jinja2.Environment(
        undefined=_CloudInitUndefined, trim_blocks=True, keep_trailing_newline=True, autoescape=False
    )
    return environment.from_string(rest).render(**jinja_variables(meta_data))


def _shellify(command: Any) -> str:
    """cloud-init's ``shellify``: a string is a line as it is; a list is its words, each quoted."""
    if isinstance(command, list):
        return " ".join(shlex.quote(str(word)) for word in command)
    if isinstance(command, str):
        return command
    raise ValueError(f"runcmd item {command!r} is neither a string nor a list")


def _write_file(entry: Mapping[str, Any]) -> list[str]:
    """Shell lines doing what cloud-init's write_files does for one entry (text, b64/base64)."""
    path = str(entry["path"])
    encoding = str(entry.get("encoding") or "text").lower()
    content = str(entry.get("content") or "")
    if encoding in ("b64", "base64"):
        data = base64.b64decode(content)
    elif encoding in ("text", "text/plain"):
        data = content.encode()
    else:
        raise ValueError(f"write_files encoding {encoding!r} is not supported here")
    quoted = shlex.quote(path)
    return [
        f'mkdir -p "$(dirname {quoted})"',
        f"printf '%s' {shlex.quote(base64.b64encode(data).decode())} | base64 -d > {quoted}",
        f"chmod {shlex.quote(str(entry.get('permissions') or '0644'))} {quoted}",
        f"chown {shlex.quote(str(entry.get('owner') or 'root:root'))} {quoted}",
    ]


def boot_script(rendered: str) -> str:
    """The shell script a node runs for rendered ``#cloud-config`` user-data: write_files, then runcmd.
    ``bootcmd`` is left out: it makes cloud-init's own instance-data.json root-only, and this simulated
    boot has no cloud-init (the whole-loop tier boots its hosts with real cloud-init)."""
    if not rendered.startswith("#cloud-config"):
        raise ValueError("rendered user-data is not #cloud-config")
    config = yaml.safe_load(rendered) or {}
    lines = ["#!/bin/sh"]
    for entry in config.get("write_files") or []:
        lines += _write_file(entry)
    lines += [_shellify(command) for command in config.get("runcmd") or []]
    return "\n".join(lines) + "\n"


def meta_data_for(slurm: Slurm, hostname: str, node_conf: str = "") -> dict[str, str]:
    """The metadata a node of ``slurm`` gets after injection, made here without the webhooks (for the CLI and the
    conformance test)."""
    host, port = slurm.config.address, str(slurm.config.port)
    return {
        "local-hostname": hostname,
        "slurm_controller_host": host,
        "slurm_controller_port": port,
        "slurm_conf_server": f"{host}:{port}",
        "slurm_key_base64": base64.b64encode(slurm.slurm_key).decode(),
        "slurm_hosts_base64": base64.b64encode(slurm.hosts_line.encode()).decode(),
        "slurm_node_conf": node_conf,
    }


class NodeDidNotJoin(WaitTimeout):
    """A booted node did not show up in slurmctld; the message says what the logs say (never a key)."""


@dataclass
class Node:
    """A booted bare-metal node: its host name (its Slurm node name), namespace, directories, boot process."""

    hostname: str
    net: NodeNet
    dir: Path
    boot: subprocess.Popen[bytes] = field(repr=False)

    def slurmd_pid(self) -> int | None:
        with suppress(OSError, ValueError):
            return int((self.dir / "run" / "slurmd.pid").read_text().strip())
        return None

    def kill_slurmd(self, sig: int = signal.SIGKILL) -> int:
        """Kill the node's slurmd (by its PID file) as a crash would; its jobs' processes stay."""
        pid = self.slurmd_pid()
        if pid is None:
            raise SlurmFailed(f"node {self.hostname} has no slurmd PID file")
        with suppress(ProcessLookupError):
            os.kill(pid, sig)
        return pid

    def job_processes(self) -> list[int]:
        """Processes in the node other than slurmd itself: job steps (slurmstepd, the job's script) or an epilog.

        slurmd is known by its PID file, or, before it has written one (a slurmd slurmctld never let register,
        say), by its program name."""
        daemon = self.slurmd_pid()
        return [p for p in self.net.pids() if p not in (daemon, self.boot.pid) and not _is_slurmd(p)]

    def slurmd_log(self) -> str:
        return tail(self.dir / "log" / "slurmd.log", 15)

    def wait_joined(self, slurm: Slurm, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until slurmctld lists this node, idle, at its address; its REST-shaped record."""
        seen: dict[str, Any] = {}

        def joined() -> dict[str, Any] | None:
            seen["node"] = node = slurm.nodes().get(self.hostname)
            if node and node.get("address") == self.net.address and "IDLE" in (node.get("state") or []):
                return node
            return None

        def why() -> str:
            log = slurm.logs().get("slurmctld.log", "").splitlines()
            refused = [line for line in log if "authentication error" in line][-2:]
            return (
                f"node {self.hostname} ({self.net.address}): slurmctld has it as "
                f"{(seen.get('node') or {}).get('state', 'nothing')}; slurmctld refusals: {refused or 'none'}; "
                f"boot output: {tail(self.dir / 'cloud-init-output.log', 5)!r}; slurmd log: {self.slurmd_log()!r}"
            )

        try:
            found = wait_for(joined, timeout, f"node {self.hostname} to join slurmctld", 0.1, why)
        except WaitTimeout as exc:
            raise NodeDidNotJoin(str(exc)) from None
        assert found is not None
        return found

    def power_off(self, network: Network) -> None:
        """The host goes away (deprovisioned): every process in it is stopped by PID, its namespace removed."""
        network.remove(self.net)
        with suppress(subprocess.TimeoutExpired):
            self.boot.wait(5)


def boot(
    root: SlurmRoot,
    network: Network,
    meta_data: Mapping[str, Any],
    nodes_dir: Path,
    *,
    shared: Path | None = None,
    user_data: Path = USER_DATA,
    address: str | None = None,
) -> Node:
    """Boot a node from ``meta_data`` with ``user_data`` (rendered and run as cloud-init would); it returns once
    started."""
    hostname = str(meta_data.get("local-hostname") or "")
    if not hostname:
        raise ValueError("metadata has no local-hostname")
    directory = nodes_dir / hostname
    suffix = 1
    while directory.exists():
        suffix += 1
        directory = nodes_dir / f"{hostname}.{suffix}"
    parts = {name: directory / name for name in ("etc", "spool", "run", "log", "cloud", "tmp")}
    for path in parts.values():
        path.mkdir(parents=True)
    parts["tmp"].chmod(0o1777)
    script = parts["cloud"] / "instance" / "scripts" / "runcmd"
    script.parent.mkdir(parents=True)
    script.touch(0o700)
    script.write_text(boot_script(render_user_data(user_data.read_text(), meta_data)))
    hosts = directory / "hosts"  # the node's own /etc/hosts (the user-data adds the controller's names)
    hosts.write_text((root.path / "etc/hosts").read_text())
    binds = [
        Bind(hosts, "/etc/hosts"),
        Bind(parts["etc"], "/etc/slurm"),
        Bind(parts["spool"], "/var/spool/slurmd"),
        Bind(parts["run"], "/run"),
        Bind(parts["log"], "/var/log/slurm"),
        Bind(parts["cloud"], "/var/lib/cloud"),
        Bind(parts["tmp"], "/tmp"),
    ]
    if shared is not None:
        binds.append(Bind(shared, "/srv/slime"))
    net = network.add(address)
    argv = chroot_argv(root.path, ["/bin/sh", SCRIPT], binds, hostname=hostname, prefix=net.exec_prefix())
    with open(directory / "cloud-init-output.log", "ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return Node(hostname, net, directory, process)


def _is_slurmd(pid: int) -> bool:
    """Whether process ``pid`` runs the slurmd program (not slurmstepd, not a job)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"slurmd"
