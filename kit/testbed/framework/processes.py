"""Processes the kit starts: started with their output in a log file, waited for, stopped by PID, never by name.

Every process :func:`spawn` starts is remembered and stopped at interpreter exit if a test or a
tool forgot it. :func:`wait_started` waits until a probe holds and fails at once, with the end of
the log, when the process exits meanwhile.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path

from testbed.framework.errors import ComponentFailed, WaitTimeout
from testbed.framework.wait import wait_for

BUILDS: set[subprocess.Popen[bytes]] = set()  # what run_logged runs now
_ENDING: list[bool] = []  # once stop_builds() ran: run_logged starts nothing more

_LIVE: dict[int, subprocess.Popen[bytes]] = {}  # every process spawn() started and stop() has not stopped yet


@atexit.register
def _stop_leftovers() -> None:
    stop_builds()
    for proc in list(_LIVE.values()):
        stop_process(proc, 2.0)


def spawn(
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, output appended to ``log`` (``stdout=subprocess.PIPE``: stdout to the
    caller, stderr to ``log``)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out if stdout is None else stdout,
            stderr=subprocess.STDOUT if stdout is None else out,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _LIVE[proc.pid] = proc
    return proc


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to one process we started, then SIGKILL if it is still there after ``grace`` seconds."""
    _LIVE.pop(proc.pid, None)
    if proc.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ("" when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_started(
    proc: subprocess.Popen[bytes],
    probe: Callable[[], object],
    timeout: float | str,
    name: str,
    log: Path,
    retry_on: tuple[type[BaseException], ...] = (),
) -> None:
    """Wait until ``probe()`` holds; :class:`ComponentFailed` with the log's end when ``proc`` exits first."""

    def started() -> object:
        if proc.poll() is not None:
            raise ComponentFailed(f"{name} exited {proc.returncode}:\n{tail(log)}")
        return probe()

    wait_for(started, timeout, f"{name} to start", retry_on=retry_on, diagnostics=lambda: f"{name}'s log:\n{tail(log)}")


# --- processes by PID, and their families ----------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone: its parent reaps it later)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM each PID, then SIGKILL those still alive after ``grace`` seconds (at once when ``grace`` is 0)."""
    for pid in pids if grace > 0 else []:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    if grace > 0:
        with suppress(WaitTimeout):  # whoever is still there after the grace gets SIGKILL below
            wait_for(lambda: not any(alive(p) for p in pids), grace, "processes to exit", interval=0.05)
    for pid in pids:
        if alive(pid):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            with suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                todo += children
    return found


def stop_tree(pid: int, grace: float = 10.0) -> None:
    """SIGTERM ``pid`` and its descendants (by PID), SIGKILL whatever is left after ``grace`` seconds."""
    kill_pids([pid, *descendants(pid)], grace)


def command_line(pid: int) -> str:
    """A process's command line (its first 80 characters), or its PID once it is gone: for reports."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return str(pid)


PROGRESS_SECONDS = 20.0


def run_logged(
    argv: Sequence[str],
    log: Path,
    what: str,
    progress: Callable[[str], None],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    counting: str = "",
    failure: type[ComponentFailed] = ComponentFailed,
) -> None:
    """Run a long command (a build, debootstrap) to its end, its output appended to ``log``; a progress line every
    :data:`PROGRESS_SECONDS` (with ``counting``: how many lines of output so far, e.g. packages compiled). A failure
    or a ``timeout`` raises ``failure`` with the end of the log."""
    if _ENDING:
        raise failure(f"{what}: not started, the process is ending")
    started = time.monotonic()
    before = _lines(log)
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # its own process group: stop_builds() ends the whole command
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    BUILDS.add(proc)
    try:
        _follow(proc, argv, log, what, progress, timeout, counting, failure, started, before)
    finally:
        BUILDS.discard(proc)


def _follow(
    proc: subprocess.Popen[bytes],
    argv: Sequence[str],
    log: Path,
    what: str,
    progress: Callable[[str], None],
    timeout: float | None,
    counting: str,
    failure: type[ComponentFailed],
    started: float,
    before: int,
) -> None:
    while True:
        try:
            code = proc.wait(timeout=PROGRESS_SECONDS)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            if timeout is not None and elapsed > timeout:
                _kill_group(proc)
                raise failure(f"{what} took more than {timeout:g} s; log {log}:\n{tail(log, 25)}") from None
            counted = f", {_lines(log) - before} {counting} so far" if counting else ""
            progress(f"{what}: {elapsed:.0f} s{counted}")
    if code != 0:
        raise failure(f"{what} failed (exit {code}): {' '.join(argv)}\nlog {log}:\n{tail(log, 25)}")
    progress(f"{what}: done in {time.monotonic() - started:.0f} s")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group run_logged made for it: the command and its children
    proc.wait(10)


def stop_builds() -> None:
    """End every command :func:`run_logged` is running (the session ends while a background build runs: its
    debootstrap or go build must not outlive it and write on into the cache)."""
    _ENDING.append(True)
    for proc in list(BUILDS):
        _kill_group(proc)


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0
