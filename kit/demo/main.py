"""``slime-demo``: the whole SliMe story on one machine, with no cluster.

An emulated management cluster (kubemu), both webhooks over TLS, and the API server's admission
chain played from the rendered chart. Then: (1) CAPM3 creates a worker's metaData Secret and
the injection webhook adds the Slurm join data; (2) KEDA scales the mirror 0 -> 3 -> 1 and the
MachineDeployment follows; (3) drift (a direct edit, and a scale while the mapping is
removed) is healed by the reconciler. Exit 0 when every expectation held, else 1.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from demo.chart import ChartError
from demo.environment import DemoEnvironment, DemoError
from demo.story import Narrator, Story
from testbed.framework.helm import HelmUnavailable
from testbed.framework.wait import WaitTimeout


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="slime-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the emulator and both webhooks up after the story, until Ctrl-C",
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=1.0, help="the scaling reconciler's period (default 1 s in the demo)"
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="the whole loop on real components (real Kubernetes, cert-manager, KEDA, Prometheus, "
        "Cluster API, CAPM3, BMO in test mode, Slurm 24.11; hosts booted by cloud-init): needs root, "
        "builds them on first use",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        metavar="DIR",
        help="with --real: write the scale-up timeline there (timeline.txt, .json, .png)",
    )
    options = parser.parse_args(argv)
    if options.figures is not None and not options.real:
        parser.error("--figures needs --real")
    if options.real and options.keep_running:
        parser.error("--keep-running is for the embedded demo; --real stops everything it started")
    return options


def _wait_for_interrupt(say: Narrator) -> None:
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    say("")
    say("stopping")


def main(
    argv: Sequence[str] | None = None,
    *,
    out: Callable[[str], None] | None = None,
    inspect: Callable[[DemoEnvironment], None] | None = None,
    on_start: Callable[[DemoEnvironment], None] | None = None,
    real_loop: Any = None,
) -> int:
    """Run the demo; 0 when every step did what it should, 1 otherwise.

    ``out`` receives each narrative line (default: print). ``on_start`` is called with the
    environment once it runs, ``inspect`` after the story (tests read the emulator through them).
    ``real_loop``: with ``--real``, a whole loop already running to tell the story on (a test
    session shares one) instead of starting one.
    """
    options = _parse(argv)
    if options.real:
        from demo import real  # the real components' kit is only loaded when asked for

        return real.run(options.figures, out or (lambda line: print(line, flush=True)), real_loop)
    say = Narrator(out or (lambda line: print(line, flush=True)))
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="slime-demo-"))
    say("SliMe local demo: an emulated cluster, both webhooks over TLS, and the API server's")
    say("admission chain played from the rendered Helm chart.")
    say.section("Setting up")
    story: Story | None = None
    try:
        with DemoEnvironment(workdir, resync_seconds=options.resync_seconds) as env:
            if on_start is not None:
                on_start(env)
            story = Story(env, say)
            story.setup_summary()
            story.act_injection()
            story.act_scaling()
            story.act_healing()
            story.check_no_key()
            if inspect is not None:
                inspect(env)
            say("")
            say(f"Demo complete in {time.monotonic() - began:.1f} s: every step did what it should.")
            if options.keep_running:
                assert env.emulator and env.injection and env.scaling and env.ca
                say.section("Everything stays up until Ctrl-C:")
                say(
                    f"  KUBECONFIG={env.kubeconfig}   (kubemu at {env.emulator.url}; e.g. kubectl get "
                    "machinedeployments -A)"
                )
                say(f"  injection webhook  {env.injection.url}/mutate   (metrics {env.injection.metrics_url}/metrics)")
                say(f"  scaling webhook    {env.scaling.url}/validate   (metrics {env.scaling.metrics_url}/metrics)")
                say(f"  CA bundle          {env.ca.cert_file}")
                say(f"  webhook logs       {env.log_file}")
                say("  Writes through the kubeconfig run the same admission chain. Files are removed on exit.")
                _wait_for_interrupt(say)
        return 0
    except (DemoError, WaitTimeout, ChartError, HelmUnavailable) as exc:
        print(f"slime-demo: FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("slime-demo: interrupted", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - a demo reports, it does not dump a bare traceback
        print(f"slime-demo: FAILED: unexpected {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        if story is not None:
            story.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
