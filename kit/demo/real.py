"""``slime-demo --real``: the whole loop on real components, the bare-metal hosts in network namespaces.

Real kube-apiserver, etcd and kube-controller-manager; real cert-manager, KEDA, Prometheus, Cluster
API, CAPM3, the baremetal-operator (test mode: no Ironic) and Slurm; the chart installed with
``helm``, both webhooks run from the image as the chart's pods. Each provisioned host boots its
config drive with real cloud-init in a network namespace and starts a real ``slurmd`` with the
join data the injection webhook filled in (:mod:`testbed.scenarios.whole_loop` says what each part is). The story is the
whole-loop test's (:func:`testbed.scenarios.story.run_story`):
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

from testbed.scenarios import stack, story, whole_loop
from testbed.scenarios.timeline import render

HOSTS = 4


def run(figures: Path | None, out: Callable[[str], None], running: whole_loop.Loop | None = None) -> int:
    """Build what is missing, run the story, print its timeline; write the figures to ``figures`` when given.

    ``running``: a whole loop already up (a test session shares one), on which only the story runs."""
    began = time.monotonic()
    out("SliMe real demo: the whole loop on real Kubernetes, cert-manager, KEDA, Prometheus, Cluster API, CAPM3,")
    out("BMO (test mode) and Slurm; hosts boot with cloud-init in network namespaces. First run builds")
    out("everything (cached by version).")
    try:
        if running is not None:
            told = story.run_story(running, out)
        else:
            found = _story(out)
            if isinstance(found, int):
                return found
            told = found
    except KeyboardInterrupt:
        print("slime-demo --real: interrupted (everything started was stopped)", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - a demo reports, it does not dump a bare traceback
        print(f"slime-demo --real: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        return 1
    return _report(told, figures, out, time.monotonic() - began)


def _story(out: Callable[[str], None]) -> story.Story | int:
    """Prepare the loop's parts, start it, run its story; an exit code when it cannot run here."""
    prepared = stack.prepare(out)
    if prepared.missing or prepared.error:
        what = "cannot run here" if prepared.missing else "FAILED preparing the control plane"
        print(f"slime-demo --real: {what}: {prepared.missing or prepared.error}", file=sys.stderr, flush=True)
        return 2 if prepared.missing else 1
    try:
        parts = whole_loop.prepare(out)
    except Exception as exc:  # noqa: BLE001 - *Unavailable or a failed build: one line, not a traceback
        missing = type(exc).__name__.endswith("Unavailable")
        what = "cannot run here" if missing else "FAILED preparing"
        print(f"slime-demo --real: {what}: {exc}", file=sys.stderr, flush=True)
        return 2 if missing else 1
    workdir = Path(tempfile.mkdtemp(prefix="slime-demo-real-"))
    try:
        with whole_loop.whole_loop(workdir / "loop", parts, hosts=HOSTS, progress=out) as running:
            return story.run_story(running, out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _report(told: story.Story, figures: Path | None, out: Callable[[str], None], seconds: float) -> int:
    out("")
    out(render(told.scale_ups))
    if figures is not None:
        written = told.write_figures(figures)
        out("figures: " + ", ".join(str(path) for path in written))
    problems = told.problems()
    for problem in problems:
        print(f"slime-demo --real: FAILED: {problem}", file=sys.stderr, flush=True)
    if not problems:
        out(
            f"Real demo complete in {seconds:.0f} s: every step did what it should, "
            "and no key appeared in any component's log."
        )
    return 1 if problems else 0
