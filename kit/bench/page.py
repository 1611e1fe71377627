"""Regenerate docs/performance.md: every generated section, measured in one session on one commit.

    python3 -m bench.page [--allow-dirty]

Runs, one after the other (each needs the machine to itself), the command of every section with
the settings the page quotes: the main bench (its head: throughput, handler-only, memory,
targets), the API-server latency, large Secrets, node demand at a long queue and the whole loop.
Each command writes its own section and names itself, the date and the commit in it. The
hand-written sections (marked so in their titles) are kept as they are.

It refuses to start on a working tree with uncommitted changes to tracked files, so every figure
names the code it measured (``--allow-dirty`` for a trial run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from testbed.framework.paths import REPO_ROOT

COMMANDS = (
    ("bench", "--duration", "5", "--latency-duration", "3", "--repeats", "3", "--no-extras", "--rss-counts",
     "10,1000,10000,10000/100,50000,100000"),
    ("bench.apiserver_latency", "--admissions", "1000", "--rate", "50", "--burners", "0,1"),
    ("bench.large_secrets", "--repeats", "3"),
    ("bench.demand_poll",),
    ("bench.scale",),
    ("bench.whole_loop", "--stories", "3"),
)  # fmt: skip


def uncommitted() -> list[str]:
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return [line[3:] for line in status.stdout.splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-dirty", action="store_true", help="run although tracked files have changes")
    args = parser.parse_args()
    changed = uncommitted()
    if changed and not args.allow_dirty:
        print(f"bench.page: uncommitted changes in {', '.join(changed)}; commit them first", file=sys.stderr)
        return 2
    started = time.monotonic()
    for module, *options in COMMANDS:
        line = " ".join(["python3 -m", module, *options])
        print(f"[bench.page] {line}", file=sys.stderr, flush=True)
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", module, *options], cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
        print(
            f"[bench.page] exit {done.returncode} after {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True
        )
        if done.returncode != 0:
            return done.returncode
    print(f"[bench.page] docs/performance.md regenerated in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
