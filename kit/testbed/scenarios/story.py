"""The story of the whole loop: jobs submitted to real Slurm, the scale-ups they cause timed step by step, scale-in.

:class:`Recorder` watches a scale-up and fills a :class:`testbed.scenarios.timeline.ScaleUp`:
kube-apiserver's audit log gives the Kubernetes steps to the microsecond (the scale writes with
their bodies, Machine and Secret creations), the scaling webhook's log the admission, and polling
(every :data:`POLL_SECONDS`) the demand and Slurm's node and job states. :func:`run_story` is what
the whole-loop test, ``slime-demo --real`` and ``bench.whole_loop`` run on a
:func:`testbed.scenarios.whole_loop.whole_loop`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testbed.components.slurm import SlurmFailed
from testbed.framework.progress import Progress, quiet
from testbed.scenarios.timeline import ScaleUp, plot, render
from testbed.scenarios.whole_loop import KEDA_COOLDOWN_SECONDS, MIRROR, POLL_SECONDS, SPEC, Loop

log = logging.getLogger("slime.testbed.story")
STARTED_STATES = {"RUNNING", "COMPLETING", "COMPLETED"}  # a job that already ended has started too


def _timestamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Recorder:
    """Fills the :class:`ScaleUp` of one job while it goes from submitted to running (call :meth:`finish` after)."""

    loop: Loop
    scale_up: ScaleUp
    job: int
    nodes: int  # the nodes the job needs
    target: int  # the replicas the pool goes to
    before: int  # the Machines the pool had when the job was submitted
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Recorder:
        self._thread = threading.Thread(target=self._poll, name=f"recorder {self.scale_up.label}", daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        # A polled step is known to a poll's resolution: marked at the poll that found it, and, as a
        # lower bound, at the last poll that read the same source without finding it (for the order
        # check: KEDA may react to the demand between two of these polls).
        absent: dict[str, float] = {}

        def found(step: str, now: float, condition: bool) -> None:
            if condition:
                self.scale_up.mark(step, now, not_before=absent.get(step))
            elif step not in self.scale_up.at:
                absent[step] = now

        while not self._stop.wait(POLL_SECONDS):
            now = time.time()
            try:
                demand = self.loop.demand()
                found("seen", now, demand is not None and demand["pendingNodes"] >= self.nodes)
                states, up = self._hosts_up()
                found("registered", now, len(up) >= self.target)
                job = self.loop.slurm_jobs().get(self.job)
                started = job is not None and bool(set(job.get("job_state") or []) & STARTED_STATES)
                found("started", now, started)
                if started and job is not None:
                    if "registered" not in self.scale_up.at:
                        # The last host registered and the job started between the two reads of this poll:
                        # Slurm starts a job only on registered nodes, so read the nodes once more.
                        states, up = self._hosts_up()
                        found("registered", now, len(up) >= self.target)
                    if "registered" not in self.scale_up.at:  # what the timeline will miss, for the failure's reader
                        log.warning(
                            "%s: job %s %s with %d of %d hosts up; node states %s",
                            self.scale_up.label,
                            self.job,
                            job.get("job_state"),
                            len(up),
                            self.target,
                            {n: sorted(s) for n, s in states.items()},
                        )
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                continue  # a component busy for a moment: the next poll sees it

    def _hosts_up(self) -> tuple[dict[str, set[str]], list[str]]:
        states = self.loop.slurm_nodes()
        up = [n for n in self.loop.hosts if states.get(n, set()) & {"IDLE", "MIXED", "ALLOCATED", "COMPLETING"}]
        return states, up

    def _leader_calls(self, events: list[dict[str, Any]]) -> None:
        """The scaling webhook's requests received between the mirror stored and its MachineDeployment write."""
        stored, written = self.scale_up.at.get("mirror"), self.scale_up.at.get("md")
        if stored is None or written is None:
            return
        for event in sorted(events, key=_received):
            username = str((event.get("user") or {}).get("username", ""))
            if username.endswith(":slime-scaling-webhook") and stored <= _received(event) <= written:
                ref = event.get("objectRef") or {}
                what = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
                self.scale_up.leader_calls.append((_received(event) - stored, f"{event.get('verb')} {what}"))

    def finish(self, since: float) -> ScaleUp:
        """Stop polling; add the Kubernetes steps from the audit log and the webhook's log (events after ``since``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        events = [
            e
            for e in self.loop.cp.audit_events()
            if e.get("stage") == "ResponseComplete" and _timestamp(e["stageTimestamp"]) >= since
        ]
        for key, resource, name in (("mirror", "deployments", MIRROR), ("md", "machinedeployments", SPEC.pool)):
            for event in events:
                ref = event.get("objectRef") or {}
                body = event.get("requestObject") or {}
                if (
                    (ref.get("resource"), ref.get("subresource"), ref.get("name")) == (resource, "scale", name)
                    and ((body.get("spec") or {}).get("replicas") or 0) >= self.target
                    and event["responseStatus"]["code"] < 300
                ):
                    self.scale_up.mark(key, _timestamp(event["stageTimestamp"]))
                    break
        self._leader_calls(events)
        for key, resource in (("machine", "machines"), ("injected", "secrets")):
            # A creation is answered 201, whether by a create or by a server-side apply (CAPI's Machines).
            created = sorted(
                _timestamp(e["stageTimestamp"])
                for e in events
                if e["responseStatus"]["code"] == 201
                and (e.get("objectRef") or {}).get("resource") == resource
                and (resource == "machines" or str(e["objectRef"].get("name", "")).endswith("-metadata"))
            )
            new = self.target - self.before
            if len(created) >= new > 0:
                self.scale_up.mark(key, created[new - 1])
        for line in self.loop.stack.pods["scaling"].logs().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if (
                entry.get("msg") == "admission"
                and entry.get("name") == MIRROR
                and entry.get("decision") == "allowed"
                and str(entry.get("reason", "")).endswith(f"follows the stored mirror to {self.target}")
                and _timestamp(entry["ts"]) >= since
            ):
                self.scale_up.mark("admitted", _timestamp(entry["ts"]))
                break
        return self.scale_up


def _received(event: dict[str, Any]) -> float:
    return _timestamp(event.get("requestReceivedTimestamp") or event["stageTimestamp"])


def scale_up(loop: Loop, label: str, nodes: int, release: str, timeout: float = 240.0) -> tuple[int, ScaleUp]:
    """Submit a ``nodes``-node job; wait until it runs; its job id and timeline."""
    before = len([m for m in loop.machines() if not m["metadata"].get("deletionTimestamp")])
    target = max(before, nodes)
    since = time.time()
    job = loop.submit(nodes, release)
    timeline = ScaleUp(label)
    timeline.mark("submitted", time.time())
    recorder = Recorder(loop, timeline, job, nodes, target, before).start()
    # The recorder is the one that sees the job start (stopping it as soon as another poll saw it
    # could lose the step); it polls until then.
    loop.wait_for(lambda: "started" in timeline.at, timeout, f"job {job} ({nodes} nodes) to start")
    return job, recorder.finish(since - 1.0)


# --- the story -------------------------------------------------------------------------------------


@dataclass
class Story:
    """What :func:`run_story` saw: the scale-ups' timelines, the jobs' final states, the scale-in."""

    scale_ups: list[ScaleUp] = field(default_factory=list)
    jobs: dict[int, list[str]] = field(default_factory=dict)  # job id -> its final job_state
    scale_in_seconds: float = 0.0  # from the jobs' end to the pool at 0 with no Machine left (the first scale-in)
    busy_hosts_released: list[str] = field(default_factory=list)  # the host booter's record: must stay empty
    queued_after_scale_in: bool = False  # a job as big as the pool accepted (and run) once the pool was back at 0
    key_leaks: list[str] = field(default_factory=list)  # the logs slurm.key or the JWT key appeared in: must stay empty

    def problems(self) -> list[str]:
        """What went wrong, one line each (empty when the loop did everything it should)."""
        found = []
        for scale_up in self.scale_ups:
            if scale_up.missing():
                found.append(f"{scale_up.label}: steps not seen: {', '.join(scale_up.missing())}")
            if scale_up.out_of_order():
                found.append(f"{scale_up.label}: out of order: {scale_up.out_of_order()}")
        if not all(state == ["COMPLETED"] for state in self.jobs.values()):
            found.append(f"a job did not complete: {self.jobs}")
        if self.busy_hosts_released:
            found.append(f"hosts powered off while Slurm ran jobs on them: {self.busy_hosts_released}")
        if not self.queued_after_scale_in:
            found.append("after scale-in Slurm refuses a job as big as the pool: its node records were lost")
        if self.key_leaks:
            found.append(f"a key appeared in: {', '.join(self.key_leaks)}")
        return found

    def write_figures(self, target: Path) -> list[Path]:
        """The timeline as text, JSON and PNG in ``target`` (docs/performance.md's figures come from these)."""
        target.mkdir(parents=True, exist_ok=True)
        text, data, image = target / "timeline.txt", target / "timeline.json", target / "timeline.png"
        text.write_text(render(self.scale_ups) + "\n")
        data.write_text(
            json.dumps(
                {
                    "scale_ups": [
                        {
                            "label": s.label,
                            "since_submit": {k: s.since_submit(k) for k in s.at},
                            "phases": dict(s.phases()),
                            "leader_calls": s.leader_calls,
                        }
                        for s in self.scale_ups
                    ],
                    "scale_in_seconds": round(self.scale_in_seconds, 1),
                    "jobs": {str(k): v for k, v in self.jobs.items()},
                },
                indent=2,
            )
            + "\n"
        )
        plot(self.scale_ups, image)
        return [text, data, image]


def run_story(loop: Loop, say: Progress = quiet) -> Story:
    """A 1-node job on an empty pool, then a pool-sized job (multi-node: all its nodes come), scale-in to 0;
    then the pool-sized job again, on hosts that were deprovisioned and provisioned anew, and scale-in again."""
    story = Story()
    pool = len(loop.hosts)
    for label, nodes in (("1-node job, pool at 0", 1), (f"{pool}-node job", pool)):
        _run_job(loop, story, label, nodes, say)
    story.scale_in_seconds = _scale_in(loop, say)
    say(f"pool back at 0 in {story.scale_in_seconds:.1f} s; a {pool}-node job again: Slurm must still accept it")
    try:
        _run_job(loop, story, f"{pool}-node job after scale-in to 0", pool, say)
    except SlurmFailed as exc:  # sbatch refused it: the pool's node records were lost at scale-in
        say(f"Slurm refused it: {exc}")
    else:
        story.queued_after_scale_in = True
        _scale_in(loop, say)
    jobs = loop.slurm_jobs()
    story.jobs = {job: list((jobs.get(job) or {}).get("job_state") or ["GONE"]) for job in loop.jobs}
    story.busy_hosts_released = list(loop.booter.violations)
    story.key_leaks = loop.key_leaks()
    say(f"jobs {story.jobs}")
    return story


def _run_job(loop: Loop, story: Story, label: str, nodes: int, say: Progress) -> None:
    """Submit a ``nodes``-node job, record its scale-up, let it end, wait until Slurm says COMPLETED."""
    # unique in the loop: a file left by an earlier story would end this job at once
    release = f"release-{len(loop.jobs) + 1}"
    say(f"submitting a {nodes}-node job")
    job, timeline = scale_up(loop, label, nodes, release)
    story.scale_ups.append(timeline)
    say(f"job {job} runs on {nodes} node(s), {timeline.since_submit('started') or 0:.1f} s after it was submitted")
    loop.finish(release)
    _wait_completed(loop, job)


def _scale_in(loop: Loop, say: Progress) -> float:
    """Wait for KEDA's cooldown and safe scale-in to take the pool to 0 with no Machine left; the seconds it took."""
    ended = time.monotonic()
    say(
        f"all jobs done; KEDA scales the mirror to 0 after its cooldown ({KEDA_COOLDOWN_SECONDS} s), then safe scale-in"
    )
    loop.wait_for(
        lambda: loop.md_replicas() == 0 and not loop.machines(), 240, "the pool back at 0 with every Machine gone"
    )
    return time.monotonic() - ended


def _wait_completed(loop: Loop, job: int) -> None:
    def completed() -> bool:
        return "COMPLETED" in (loop.slurm_jobs().get(job, {}).get("job_state") or [])

    loop.wait_for(completed, 60, f"job {job} to complete")
