"""What the scaling leader's reconcile pass costs as the site grows: hosts, pools, Machines changing at once.

    python3 -m bench.scale [--hosts 200,2000,10000] [--pools 1,10,50] [--unrelated 20000] [--no-write]

Each world runs on kubemu with the fake slurmrestd (``testbed.components.fake_slurmrestd``) and the
project's Cluster API stand-in (``testbed.components.capi_sim``, one MachineSet per pool): ``hosts``
hosts split over ``pools`` pools, every pool with ``safeScaleIn``, each at 75 % of its hosts with
half its nodes running jobs. The scaling service is built exactly as its console script builds it
(``build_service``, no leader election) and its passes are called one at a time, so each is
measured alone: the CPU time of the thread running it, its wall time, the API requests it makes
(kubemu's request log, Events left out: a thread sends them off the pass) and its slurmrestd
requests (the fake's log). Three phases:

- **steady**: nothing changes; three passes (the median is reported).
- **scale-out 25 %**: every mirror goes to all its pool's hosts; passes run, the stand-in creates
  the Machines and their slurmd join, until every pool is there.
- **scale-in 25 %**: 80 % of the nodes run jobs (more than the 75 % kept, so victims are busy),
  every mirror goes back to 75 %; after three passes every job ends (a large job ending); passes
  run until every pool is back. Busy nodes released (the stand-in and the fake count them) must be 0.

Then the leader's RSS: the ``scaling-webhook`` console script as its own process against the same
world, once ``/readyz`` answers and its RSS stops growing (its first pass has listed the pools'
Machines; it runs without leader election, and nothing changes, so it writes nothing). With
``--unrelated N`` one more world (2,000 hosts, 10 pools) has N Machines of another tenant's pools
in another namespace. Writes the ``scale`` section of docs/performance.md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.sections import measured_on, replace_section
from bench.servers import memory
from certs.devcerts import create_ca, issue_serving_cert
from kubemu import Emulator
from scaling_webhook.app import ScalingService, build_service
from scaling_webhook.mappings import Mapping
from scaling_webhook.settings import ScalingSettings
from testbed.components.capi_sim import JWT_KEY, JWT_NS, MD_NS, CapiSim
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.services import wait_machine_caches
from testbed.framework.objects import CAPI, SLIME_NAMESPACE, config_map, machine_deployment, mirror
from testbed.framework.paths import REPO_ROOT
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for
from testbed.framework.world import make_jwt_key
from testbed.scenarios.site import JWT_SECRET

KEPT, BUSY_STEADY, BUSY_SCALE_IN = 0.75, 0.5, 0.8  # of a pool's hosts: Machines at steady state; nodes running jobs
JOBS_END_AFTER = 3  # scale-in passes before the large job ends
MAX_PASSES = 200  # a phase that has not settled by then is reported as such
FAR = 10**10  # a job end time that never comes
PAGE = REPO_ROOT / "docs" / "performance.md"


@dataclass
class Pass:
    cpu_ms: float
    wall_ms: float
    api: int
    slurm: int  # slurmrestd reads (GET)
    slurm_writes: int  # slurmrestd writes (a drain, a return to FUTURE, an undrain: one request per node)
    writes: int


@dataclass
class Phase:
    name: str
    passes: list[Pass] = field(default_factory=list)
    settled: bool = True
    busy_released: int = 0

    def median(self, attribute: str) -> float:
        return statistics.median(getattr(p, attribute) for p in self.passes) if self.passes else 0.0

    def total(self, attribute: str) -> int:
        return int(sum(getattr(p, attribute) for p in self.passes))


@dataclass
class WorldResult:
    hosts: int
    pools: int
    unrelated: int
    phases: list[Phase]
    rss_mib: float = 0.0
    seed_s: float = 0.0


class World:
    """``hosts`` hosts in ``pools`` pools on kubemu, the fake slurmrestd, the scaling service built in this process."""

    def __init__(self, workdir: Path, hosts: int, pools: int, unrelated: int) -> None:
        self.workdir, self.hosts, self.pools, self.unrelated = workdir, hosts, pools, unrelated
        self.per_pool = hosts // pools
        self.kept = int(self.per_pool * KEPT)
        self.key = make_jwt_key()
        self.emulator = Emulator().start()
        self.slurm = FakeSlurmrestd(self.key)
        self.sims = [CapiSim(self.emulator, slurm=self.slurm, pool=f"md-{i}", subnet=i) for i in range(pools)]
        self.kubeconfig = self.emulator.write_kubeconfig(workdir / "kubeconfig")
        self.service: ScalingService | None = None

    def seed(self) -> None:
        emu = self.emulator
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": JWT_SECRET, "namespace": JWT_NS}}
        emu.create({**secret, "type": "Opaque", "data": {JWT_KEY: base64.b64encode(self.key).decode()}})
        mappings = []
        for i, sim in enumerate(self.sims):
            emu.create(mirror(f"mirror-{i}", replicas=self.kept, adopted_from=f"{MD_NS}/{sim.pool}"))
            emu.create(machine_deployment(sim.pool, MD_NS, replicas=self.kept))
            for _ in range(self.kept):
                sim.add_machine()
            block = {"slurmrestd": self.slurm.url, "jwtSecret": f"{JWT_NS}/{JWT_SECRET}"}
            mappings.append(
                {
                    "mirror": f"{SLIME_NAMESPACE}/mirror-{i}",
                    "machineDeployment": f"{MD_NS}/{sim.pool}",
                    "maxReplicas": self.per_pool,
                    "safeScaleIn": block,
                }
            )
        self.busy(BUSY_STEADY)
        for n in range(self.unrelated):  # another tenant's pools: Machines the leader must not pay for
            labels = {"cluster.x-k8s.io/deployment-name": f"other-{n % 100}", "cluster.x-k8s.io/cluster-name": "other"}
            meta = {"name": f"other-{n:05d}", "namespace": "other-tenant", "labels": labels}
            emu.create({"apiVersion": f"{CAPI}/v1beta1", "kind": "Machine", "metadata": meta, "spec": {}})
        emu.create(config_map({"mappings": yaml.safe_dump(mappings, sort_keys=False)}))

    def busy(self, share: float) -> None:
        """Jobs on nodes until ``share`` of every pool's joined nodes run one."""
        with self.slurm.lock:
            nodes = list(self.slurm.nodes.values())
        want = int(len(nodes) * share) - sum(1 for n in nodes if n.busy)
        for node in [n for n in nodes if not n.busy][: max(0, want)]:
            self.slurm.start_job(node.name, end=FAR)

    def start_service(self, cert: Path, key: Path) -> ScalingService:
        values: dict[str, Any] = {
            "cert_file": str(cert),
            "key_file": str(key),
            "KUBECONFIG": self.kubeconfig,
            "namespace": SLIME_NAMESPACE,
            "leader_election": False,
            "resync_seconds": 3600,
            "log_level": "WARNING",
        }
        settings = ScalingSettings(**values)
        self.service = build_service(settings)
        wait_for(lambda: self.service is not None and self.service.source.loaded, 60, "the mappings", 0.05)
        return self.service

    def measure(self) -> Pass:
        """One pass, once the service's caches hold what the emulator stores (from the second pass: the first
        starts the pools' Machine watches)."""
        service = self.service
        assert service is not None
        if service.reconciler.passes:
            wait_machine_caches(service, self.emulator, 120)
        api_before, slurm_before = len(self.emulator.requests), len(self.slurm.calls)
        cpu, wall = time.thread_time(), time.perf_counter()
        changes = service.reconciler.reconcile_once()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        requests = [
            r
            for r in self.emulator.requests[api_before:]
            if r.user_agent.startswith("slime-scaling-webhook") and r.resource != "events" and not r.non_resource
        ]
        writes = sum(1 for r in requests if r.verb not in ("get", "list", "watch"))
        calls = self.slurm.calls[slurm_before:]
        reads = sum(1 for method, _ in calls if method == "GET")
        return Pass(cpu * 1000, wall * 1000, len(requests), reads, len(calls) - reads, writes + len(changes))

    def settled(self, replicas: int) -> bool:
        for sim in self.sims:
            machines = sim.machines()
            if len(machines) != replicas or any(m["metadata"].get("deletionTimestamp") for m in machines):
                return False
            md = self.emulator.get(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, sim.pool)
            if md is None or md["spec"].get("replicas") != replicas:
                return False
        return True

    def scale_mirrors(self, replicas: int) -> None:
        service = self.service
        assert service is not None
        for i in range(self.pools):
            patch = {"spec": {"replicas": replicas}}
            self.emulator.patch("apps/v1", "Deployment", SLIME_NAMESPACE, f"mirror-{i}", patch)
        for mapping in service.source.table:

            def seen(mapping: Mapping = mapping) -> bool:
                return ((service.objects.mirror(mapping) or {}).get("spec") or {}).get("replicas") == replicas

            wait_for(seen, 30, f"the service's watch of {mapping.mirror}", 0.01)

    def run_until(self, phase: Phase, replicas: int, on_pass: Any = None) -> Phase:
        for index in range(MAX_PASSES):
            phase.passes.append(self.measure())
            if on_pass is not None:
                on_pass(index)
            for sim in self.sims:
                sim.step()
            if self.settled(replicas) and phase.passes[-1].writes == 0:
                break
        else:
            phase.settled = False
        phase.busy_released = sum(len(s.violations) for s in self.sims) + len(self.slurm.violations)
        return phase

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
        self.slurm.stop()
        self.emulator.stop()


def leader_rss(world: World, cert: Path, key: Path) -> float:
    """The ``scaling-webhook`` process's RSS (MiB) with this world, ready and past its first pass."""
    port, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "scaling_webhook.main", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--metrics-port", str(metrics), "--cert-file", str(cert), "--key-file", str(key)]
    command += ["--kubeconfig", world.kubeconfig, "--namespace", SLIME_NAMESPACE, "--leader-election", "false"]
    command += ["--resync-seconds", "3600", "--log-level", "warning"]
    log = (world.workdir / "scaling-rss.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:

        def first_pass_done() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"scaling-webhook exited {process.returncode}; see {log.name}")
            try:
                text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
            except httpx.HTTPError:
                return False
            return any(line.startswith("slime_scaling_leader 1") for line in text.splitlines()) and (
                httpx.get(f"http://127.0.0.1:{metrics}/readyz", timeout=5).status_code == 200
            )

        wait_for(first_pass_done, 300, "the scaling-webhook process ready", 0.2)
        # Its first pass lists the pools' Machines after it is ready: read once the RSS stops growing.
        readings = [memory(process.pid)["VmRSS"]]
        for _ in range(30):
            time.sleep(1.0)
            readings.append(memory(process.pid)["VmRSS"])
            if abs(readings[-1] - readings[-2]) < 0.01 * readings[-1]:
                break
        return round(readings[-1], 1)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@contextmanager
def tls(workdir: Path) -> Iterator[tuple[Path, Path]]:
    ca = create_ca(workdir / "ca")
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    issue_serving_cert(ca, cert, key, ["localhost"], ["127.0.0.1"])
    yield cert, key


def run_world(workdir: Path, hosts: int, pools: int, unrelated: int, cert: Path, key: Path) -> WorldResult:
    world = World(workdir, hosts, pools, unrelated)
    try:
        started = time.monotonic()
        world.seed()
        seeded = time.monotonic() - started
        world.start_service(cert, key)
        world.run_until(Phase("priming"), world.kept)  # the first passes put the hooks on every Machine
        steady = Phase("steady", [world.measure() for _ in range(3)])
        world.scale_mirrors(world.per_pool)
        out = world.run_until(Phase("scale-out 25%"), world.per_pool)
        world.busy(BUSY_SCALE_IN)
        world.scale_mirrors(world.kept)

        def large_job_ends(index: int) -> None:
            if index == JOBS_END_AFTER - 1:
                for name in list(world.slurm.nodes):
                    world.slurm.finish_jobs(name)

        scale_in = world.run_until(Phase("scale-in 25%"), world.kept, large_job_ends)
        result = WorldResult(hosts, pools, unrelated, [steady, out, scale_in], seed_s=seeded)
        result.rss_mib = leader_rss(world, cert, key)
        return result
    finally:
        world.close()


def _growth(value: float, before: float | None) -> str:
    return "" if not before else f" (×{value / before:.1f})"


def render(results: list[WorldResult], command: str) -> str:
    lines = [
        "## A 2,000-node site: what a reconcile pass costs (issue 34)",
        "",
        f"{measured_on()}; reproduce with `{command}` (kit/bench/scale.py says how each world is built).",
        "",
        "Each row is one phase of one world (hosts split evenly over pools, every pool with `safeScaleIn`).",
        "CPU and wall are the median pass; API and slurmrestd are requests per pass (median) and in all;",
        "(×n) is the growth against the row with the same pools and phase and the next smaller site.",
        "",
        "| hosts | pools | unrelated Machines | phase | passes | CPU ms/pass | wall ms/pass | API req/pass "
        "(all) | slurmrestd reads/pass (all) | slurmrestd writes (all) | busy released | settled | leader RSS MiB |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    previous: dict[tuple[int, int, str], Phase] = {}
    for result in results:
        for phase in result.phases:
            key = (result.pools, result.unrelated, phase.name)
            before = previous.get(key)
            cpu = phase.median("cpu_ms")
            growth = _growth(cpu, before.median("cpu_ms") if before else None)
            lines.append(
                f"| {result.hosts:,} | {result.pools} | {result.unrelated:,} | {phase.name} | {len(phase.passes)} | "
                f"{cpu:.1f}{growth} | {phase.median('wall_ms'):.1f} | "
                f"{phase.median('api'):.0f} ({phase.total('api')}) | "
                f"{phase.median('slurm'):.0f} ({phase.total('slurm')}) | {phase.total('slurm_writes')} | "
                f"{phase.busy_released} | "
                f"{'yes' if phase.settled else 'NO'} | {result.rss_mib:.0f} |"
            )
            previous[key] = phase
    lines += [
        "",
        "A pass reads Slurm's node list once (a scale-in decision reads it once more, afresh, after its drains, to",
        "catch a job that started in between) and each node once more, by name, right before its Machine is let go;",
        "every other read comes from the watch caches. Slurm's writes are one request per node and step: a drain",
        "when a node is chosen, a return to FUTURE when its Machine is let go, so a scale-in of n nodes writes 2n",
        "times. Not yet done: slurmrestd's batch node update (`POST nodes/`, served by 24.11 and 26.05) could take",
        "a pass's drains, and its releases, in one request each; each release would still rest on its node's own",
        "fresh read. The leader's Machine, MachineDeployment and mirror watches are narrowed by name or by",
        "the pool's `cluster.x-k8s.io/deployment-name` label, so the unrelated Machines of another namespace never",
        "reach it (compare the rows with and without them).",
        "",
        *targets(results),
    ]
    return "\n".join(lines)


def targets(results: list[WorldResult]) -> list[str]:
    """The issue's targets, each with what was measured."""
    found = {(r.hosts, r.pools, r.unrelated): r for r in results}
    out = ["Targets:", ""]
    site = found.get((2000, 1, 0))
    if site is not None:
        steady, _, scale_in = site.phases
        cpu, slurm = steady.median("cpu_ms"), steady.median("slurm")
        out.append(
            f"- steady pass at 2,000 hosts ≤ 50 ms CPU, ≤ 1 slurmrestd request: {cpu:.1f} ms, {slurm:.0f} request"
        )
        allowed = 2 * len(scale_in.passes) + 500
        out.append(
            f"- scale-in of 500 at 2,000 hosts: {scale_in.busy_released} busy released (0 allowed), "
            f"{scale_in.total('slurm')} slurmrestd reads in {len(scale_in.passes)} passes (≤ {allowed} allowed), "
            f"and {scale_in.total('slurm_writes')} writes"
        )
    small = found.get((200, 1, 0))
    if site is not None and small is not None:
        ratio = site.phases[0].median("cpu_ms") / max(small.phases[0].median("cpu_ms"), 1e-6)
        out.append(f"- growth 200 -> 2,000 hosts (steady CPU, 10× the hosts): ×{ratio:.1f} (≤ ×10 is linear)")
    crowded, alone = found.get((2000, 10, max((r.unrelated for r in results), default=0))), found.get((2000, 10, 0))
    if crowded is not None and alone is not None and crowded is not alone:
        ratio = crowded.phases[0].median("cpu_ms") / max(alone.phases[0].median("cpu_ms"), 1e-6)
        out.append(
            f"- {crowded.unrelated:,} unrelated Machines beside 2,000 hosts in 10 pools: steady CPU ×{ratio:.2f}, "
            f"leader RSS {crowded.rss_mib:.0f} MiB against {alone.rss_mib:.0f} MiB"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="200,2000,10000")
    parser.add_argument("--pools", default="1,10,50")
    parser.add_argument("--unrelated", type=int, default=20000, help="Machines of another tenant (0: no such world)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    hosts = [int(h) for h in args.hosts.split(",")]
    pools = [int(p) for p in args.pools.split(",")]
    results: list[WorldResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, tls(Path(tmp)) as (cert, key):
        worlds = [(h, p, 0) for p in pools for h in hosts if h // p >= 4]
        if args.unrelated:
            worlds.append((2000, 10, args.unrelated))
        for h, p, unrelated in worlds:
            print(f"[bench.scale] {h} hosts, {p} pools, {unrelated} unrelated Machines", file=sys.stderr, flush=True)
            workdir = Path(tmp) / f"{h}-{p}-{unrelated}"
            workdir.mkdir()
            results.append(run_world(workdir, h, p, unrelated, cert, key))
            for phase in results[-1].phases:
                print(
                    f"[bench.scale]   {phase.name}: {len(phase.passes)} passes, "
                    f"CPU {phase.median('cpu_ms'):.1f} ms/pass, slurmrestd {phase.total('slurm')} reads "
                    f"{phase.total('slurm_writes')} writes, "
                    f"API {phase.total('api')}, busy released {phase.busy_released}, settled {phase.settled}",
                    file=sys.stderr,
                    flush=True,
                )
    command = "python3 -m bench.scale " + " ".join(sys.argv[1:])
    text = render(results, command.strip())
    print(text)
    if not args.no_write:
        replace_section(PAGE, "scale", text)
    return 0 if all(p.busy_released == 0 for r in results for p in r.phases) else 1


if __name__ == "__main__":
    sys.exit(main())
