"""``python -m demo.busy``: run ``slime-demo`` N times while CPU-bound processes compete for the machine.

The demo waits on conditions with limits meant for a busy machine (``BUSY_MACHINE_SECONDS``);
this proves it. Each run is a fresh ``slime-demo`` process (its own kubemu, webhooks and chain),
started one after the other while ``--burners`` processes spin on the CPU for the whole session
(each bounded to ``--runs`` × 300 s, and stopped by PID at the end, however the session ends).
It prints one line per run (exit code, seconds) and a summary, keeps the output of a failed run,
and exits 0 only when every run passed::

    python -m demo.busy --runs 10 --burners 2

docs/testing.md records the last result. No timing is asserted anywhere: the seconds are shown
so a slow run can be seen, not judged.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.framework.cpu import burner
from testbed.framework.processes import stop_process

RUN_LIMIT_SECONDS = 300.0  # one demo run, however busy the machine: a hung run is stopped and counted as failed


@dataclass(frozen=True)
class Run:
    number: int
    code: int
    seconds: float
    tail: str  # the end of a failed run's output ("" when it passed)


def run_demo(number: int, command: Sequence[str]) -> Run:
    started = time.monotonic()
    try:
        proc = subprocess.run(
            list(command), capture_output=True, text=True, timeout=RUN_LIMIT_SECONDS, stdin=subprocess.DEVNULL
        )
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        partial = [p.decode(errors="replace") if isinstance(p, bytes) else (p or "") for p in (exc.stdout, exc.stderr)]
        output = f"{''.join(partial)}\nstopped after {RUN_LIMIT_SECONDS:.0f} s"
    seconds = time.monotonic() - started
    return Run(number, code, seconds, "" if code == 0 else "\n".join(str(output).splitlines()[-15:]))


def session(runs: int, burners: int, command: Sequence[str], say: Callable[[str], None] = print) -> list[Run]:
    """``runs`` demo runs one after the other, ``burners`` CPU-bound processes running beside them."""
    load = [burner(runs * RUN_LIMIT_SECONDS) for _ in range(burners)]
    results: list[Run] = []
    try:
        say(
            f"{burners} CPU-bound process(es) running (PIDs {', '.join(str(p.pid) for p in load) or 'none'}); "
            f"{os.cpu_count()} CPU(s)"
        )
        for number in range(1, runs + 1):
            result = run_demo(number, command)
            results.append(result)
            say(
                f"run {number}/{runs}: {'passed' if result.code == 0 else f'FAILED (exit {result.code})'} "
                f"in {result.seconds:.1f} s"
            )
            if result.tail:
                say("  " + result.tail.replace("\n", "\n  "))
    finally:
        for process in load:
            stop_process(process)
    passed = sum(1 for r in results if r.code == 0)
    slowest = max((r.seconds for r in results), default=0.0)
    say(f"{passed}/{runs} runs passed with {burners} CPU-bound process(es) beside them (slowest {slowest:.1f} s)")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.busy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="demo runs, one after the other (default 10)")
    parser.add_argument("--burners", type=int, default=2, help="CPU-bound processes beside them (default 2)")
    options = parser.parse_args(argv)
    if options.runs < 1 or options.burners < 0:
        parser.error("--runs must be at least 1 and --burners at least 0")
    demo = Path(sys.executable).with_name("slime-demo")
    command = [str(demo)] if demo.exists() else [sys.executable, "-m", "demo.main"]
    results = session(options.runs, options.burners, command, lambda line: print(line, flush=True))
    return 0 if all(r.code == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
