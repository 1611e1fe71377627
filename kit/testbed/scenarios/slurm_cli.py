"""``slime-slurm``: the real-Slurm tier's Slurm (and N bare-metal nodes booted from the documented user-data) for a
person."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import jwt

from testbed.components.cloudinit import boot, meta_data_for
from testbed.components.debian_root import SlurmRoot, Unavailable, chroot_argv, prepare_root
from testbed.components.netns import Network
from testbed.components.slurm import Slurm, SlurmConfig, SlurmFailed
from testbed.framework.pins import DEFAULT_SLURM, SLURM_RELEASES
from testbed.framework.ports import free_port


def main(argv: Sequence[str] | None = None) -> int:
    """``slime-slurm``: start the tier's Slurm (and N bare-metal nodes booted from the documented user-data) for a
    person."""
    parser = argparse.ArgumentParser(prog="slime-slurm", description=main.__doc__)
    parser.add_argument("--nodes", type=int, default=2, help="bare-metal nodes to boot (default 2)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the keys, configs and logs go (default: a new temporary directory)",
    )
    parser.add_argument("--check", action="store_true", help="run srun -N<nodes> hostname, print the result and stop")
    parser.add_argument(
        "--token",
        type=Path,
        metavar="JWT_KEY_FILE",
        help="only print a JWT for slurmrestd (sun=slurm, valid 1 h) signed with this jwt_hs256.key",
    )
    parser.add_argument(
        "--slurm",
        choices=sorted(SLURM_RELEASES),
        default=DEFAULT_SLURM.series,
        help=f"the Slurm release (Debian packages; default {DEFAULT_SLURM.series})",
    )
    args = parser.parse_args(argv)
    if args.token is not None:
        now = int(time.time())
        print(jwt.encode({"sun": "slurm", "iat": now, "exp": now + 3600}, args.token.read_bytes(), algorithm="HS256"))
        return 0
    try:
        root = prepare_root(release=SLURM_RELEASES[args.slurm])
    except Unavailable as exc:
        print(f"slime-slurm: {exc}", file=sys.stderr)
        return 2
    try:
        return _serve(root, args.nodes, args.workdir, args.check)
    except SlurmFailed as exc:
        print(f"slime-slurm: {exc}", file=sys.stderr)
        return 1


def _serve(root: SlurmRoot, count: int, workdir: Path | None, check: bool) -> int:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="slime-slurm-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Network() as network:
        config = SlurmConfig.slinky(root, network.host_address, free_port(30000, 32767))
        with Slurm(root, workdir / "controller", config) as slurm:
            nodes = []
            for index in range(count):
                nodes.append(
                    boot(
                        root,
                        network,
                        meta_data_for(slurm, f"bm-node-{index + 1}"),
                        workdir / "nodes",
                        shared=slurm.shared,
                    )
                )
            for node in nodes:
                node.wait_joined(slurm)
            print(
                f"Slurm {root.release}: slurmctld {config.hostname}({slurm.conf_server}), slurmrestd {slurm.restd_url}"
            )
            print(f"  nodes: {', '.join(f'{n.hostname} ({n.net.address}, netns {n.net.netns})' for n in nodes)}")
            print(
                f"  files: {workdir} (slurm.key and jwt_hs256.key in controller/etc, mode 0600; logs in controller/log)"
            )
            print(
                f'  API:   curl -H "X-SLURM-USER-TOKEN: $(slime-slurm --token {slurm.etc / "jwt_hs256.key"})" '
                f"{slurm.restd_url}/slurm/{root.api_version}/nodes/"
            )
            helper = workdir / "slurm"
            helper.write_text(
                "#!/bin/sh\n"
                "# Run a Slurm command (sinfo, squeue, sbatch, scontrol ...) on the controller's side.\n"
                "exec " + shlex.join(chroot_argv(root.path, [], slurm.binds(), hostname=config.host_name)) + ' "$@"\n'
            )
            helper.chmod(0o755)
            print(
                f"  CLI:   {helper} sinfo    ({helper} sbatch -N2 --wrap 'srun hostname', {helper} scontrol show "
                "nodes, ...)"
            )
            if check:
                out = slurm.client(["srun", f"-N{count}", "hostname"], timeout=60).stdout
                print(f"  srun -N{count} hostname: {' '.join(sorted(out.split()))}")
                return 0
            print("Ctrl-C stops everything (processes by PID, namespaces, bridge).")
            with suppress(KeyboardInterrupt):
                while not stop.wait(1):
                    pass
            for node in nodes:
                node.power_off(network)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
