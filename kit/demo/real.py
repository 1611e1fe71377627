"""``slime-demo --real``: the whole loop on real components, the bare-metal hosts in network namespaces.

Real kube-apiserver, etcd and kube-controller-manager; real cert-manager, KEDA, Prometheus, Cluster
API, CAPM3, the baremetal-operator (test mode: no Ironic) and Slurm 24.11; the chart installed with
``helm``, both webhooks run from the image as the chart's pods. Each provisioned host boots its
config drive with real cloud-init in a network namespace and starts a real ``slurmd`` with the
join data the injection webhook filled in (:mod:`testbed.real.loop` says what each part is). The story is the
whole-loop test's (:func:`testbed.real.loop.run_story`):
a 1-node job on an empty pool, then a 4-node job, then scale-in back to 0.

It needs root (network namespaces, chroot, podman) and builds or fetches every component on first
use (about 40 minutes on 2 cores; cached by version, so later runs start in a minute or two).
Exit 0 when the loop did everything it should, 1 otherwise, 2 when a prerequisite is missing.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from testbed.real import loop, tier
from testbed.real.timeline import render

HOSTS = 4


def run(figures: Path | None, out: Callable[[str], None]) -> int:
    """Build what is missing, run the story, print its timeline; write the figures to ``figures`` when given."""
    began = time.monotonic()
    out("SliMe real demo: the whole loop on real Kubernetes, cert-manager, KEDA, Prometheus, Cluster API, CAPM3,")
    out("BMO (test mode) and Slurm 24.11; hosts boot with cloud-init in network namespaces. First run builds")
    out("everything (cached by version).")
    prepared = tier.prepare(out)
    if prepared.missing:
        print(f"slime-demo --real: cannot run here: {prepared.missing}", file=sys.stderr, flush=True)
        return 2
    if prepared.error:
        print(f"slime-demo --real: FAILED preparing the control plane: {prepared.error}", file=sys.stderr, flush=True)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="slime-demo-real-"))
    try:
        try:
            parts = loop.prepare(workdir / "parts", out)
        except Exception as exc:  # noqa: BLE001 - *Unavailable or a failed build: one line, not a traceback
            missing = type(exc).__name__.endswith("Unavailable")
            print(
                f"slime-demo --real: {'cannot run here' if missing else 'FAILED preparing'}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return 2 if missing else 1
        with loop.whole_loop(workdir / "loop", parts, hosts=HOSTS, progress=out) as running:
            story = loop.run_story(running, out)
        out("")
        out(render(story.scale_ups))
        if figures is not None:
            written = story.write_figures(figures)
            out("figures: " + ", ".join(str(path) for path in written))
        problems = story.problems()
        for problem in problems:
            print(f"slime-demo --real: FAILED: {problem}", file=sys.stderr, flush=True)
        if not problems:
            out(
                f"Real demo complete in {time.monotonic() - began:.0f} s: every step did what it should, "
                "and no key appeared in any component's log."
            )
        return 1 if problems else 0
    except KeyboardInterrupt:
        print("slime-demo --real: interrupted (everything started was stopped)", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - a demo reports, it does not dump a bare traceback
        print(f"slime-demo --real: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
