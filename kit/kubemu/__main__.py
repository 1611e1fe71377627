"""`kubemu` CLI: serve an emulated cluster until interrupted (used by the local demo)."""

from __future__ import annotations

import argparse
import signal
import threading

import yaml

from .emulator import Emulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kubemu", description="Kubernetes API-server emulator")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="FILE.yaml",
        help="multi-document YAML of objects to create at start (repeatable)",
    )
    parser.add_argument("--kubeconfig-out", metavar="PATH", help="write a kubeconfig for the emulator here")
    parser.add_argument("--namespace", default="default", help="namespace of the kubeconfig context")
    parser.add_argument("--token", help="require this bearer token")
    args = parser.parse_args(argv)

    emulator = Emulator(port=args.port, token=args.token)
    for path in args.seed:
        with open(path, encoding="utf-8") as fh:
            for doc in yaml.safe_load_all(fh):
                if doc:
                    emulator.create(doc)
    emulator.start()
    if args.kubeconfig_out:
        emulator.write_kubeconfig(args.kubeconfig_out, namespace=args.namespace)
    print(f"kubemu serving on {emulator.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
