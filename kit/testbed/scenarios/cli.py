"""``slime-control-plane``: start the tier's real control plane for a person, until Ctrl-C.

The same etcd + kube-apiserver + kube-controller-manager as the tests (``testbed.components.controlplane``),
with the Cluster API, CAPM3 and Slinky CRDs installed, on 127.0.0.1 ports chosen at start. It
prints the admin kubeconfig; then ``kubectl``, ``helm install charts/slime`` and the services'
``--kubeconfig`` work against it.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from pathlib import Path

from testbed.components.controlplane import ControlPlane, binaries
from testbed.components.crds import crd_files
from testbed.framework.errors import ComponentFailed, ComponentUnavailable
from testbed.framework.progress import to_stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slime-control-plane", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--dir", type=Path, help="work directory (logs, PKI, etcd data); default: a new temporary one")
    parser.add_argument("--no-crds", action="store_true", help="do not install the CAPI, CAPM3 and Slinky CRDs")
    parser.add_argument("--admission-control-config-file", type=Path, help="passed to kube-apiserver")
    args = parser.parse_args(argv)
    try:
        found = binaries()
        crds = [] if args.no_crds else crd_files()
    except (ComponentUnavailable, ComponentFailed) as exc:
        to_stderr(f"cannot start: {exc}")
        return 2
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="slime-control-plane-"))
    cp = ControlPlane(workdir, found, admission_config=args.admission_control_config_file)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        started = time.monotonic()
        cp.start()
        if crds:
            cp.install_crds(crds)
        print(
            f"control plane up in {time.monotonic() - started:.1f} s ({found.source})\n"
            f"  kube-apiserver {cp.url}   etcd http://127.0.0.1:{cp.etcd_port}   logs and audit log in {workdir}\n"
            f"  export KUBECONFIG={cp.kubeconfig}\n"
            f"  kubectl: {found.kubectl}\n"
            "Ctrl-C stops it.",
            flush=True,
        )
        while not stop.wait(1.0):
            for name, proc in cp.processes.items():
                if proc.poll() is not None:
                    to_stderr(f"{name} exited {proc.returncode}; see {workdir / (name + '.log')}")
                    return 1
        return 0
    except ComponentFailed as exc:
        to_stderr(str(exc))
        return 1
    finally:
        cp.stop()


if __name__ == "__main__":
    raise SystemExit(main())
