"""Run a chart Deployment's pod template as the kubelet would, with podman (or, faster, as local processes).

There is no kubelet here, so this module plays its part for one pod, from the Deployment the
chart installed (``helm get manifest``), exactly as written there:

- the container's ``command``, ``args`` and ``env`` (``fieldRef`` ``metadata.namespace`` and
  ``metadata.name`` resolved as the downward API does), plus ``KUBERNETES_SERVICE_HOST/PORT``
  pointing at the test API server (the in-cluster configuration the services load);
- every ``volumeMount`` at its ``mountPath``: ``secret`` and ``configMap`` volumes materialized
  from the API server (``items`` and ``defaultMode`` honoured, group-owned by ``fsGroup``),
  ``emptyDir`` as a tmpfs, and the service-account token from the TokenRequest API with the
  cluster CA and namespace at ``/var/run/secrets/kubernetes.io/serviceaccount`` (what the
  ServiceAccount admission plugin's projected volume gives a pod), so every API call the service
  makes is checked by the real RBAC of its ServiceAccount;
- the ``securityContext``: ``runAsUser``/``runAsGroup``/``fsGroup``, ``readOnlyRootFilesystem``
  (podman ``--read-only`` with no extra tmpfs: only the pod's own volumes are writable),
  ``capabilities.drop: [ALL]``, ``allowPrivilegeEscalation: false``; ``runAsNonRoot`` is checked;
- readiness from the container's ``readinessProbe`` (``httpGet`` on its named port);
- termination as kubelet does it (:meth:`Pod.terminate`): the ``preStop`` exec hook run in the
  container, then SIGTERM, then SIGKILL when ``terminationGracePeriodSeconds`` (counted from the
  start of the hook) has run out;
- with ``kubelet_volumes=True``, secret and configMap volumes laid out as kubelet's AtomicWriter
  does (the files are symlinks through ``..data`` to a timestamped directory) and refreshed by
  :meth:`Pod.sync_volumes` (run it periodically with :class:`VolumeSync`, as kubelet's pod
  sync does): a renewed Secret reaches the running pod by an atomic ``..data`` swap, never as a
  half-written pair.

The pod runs on the host network (there is no pod network), so its ports are the chart's
ports: the tier picks free ones for ``injection.port``/``scaling.port`` at install. A pod given
a ``pod_ip`` (a loopback address of its own, :mod:`testbed.components.kubelet`) gets it as the downward
API's ``status.podIP`` and is probed there, so two pods of one Deployment can run side by side.
Resource limits and affinity are not applied (nothing schedules here).

:func:`run_process` is the inner-loop variant: the same console script, env and token, as a
local process; the token comes in a kubeconfig instead of the in-cluster files, and file paths
under a ``mountPath`` point at the materialized copies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testbed.components.controlplane import ControlPlane
from testbed.components.image import podman
from testbed.components.volumes import SA_DIR, Synced, atomic_write, materialize, volume_files
from testbed.framework.errors import ComponentFailed
from testbed.framework.processes import spawn, stop_process
from testbed.framework.wait import wait_for


class PodFailed(ComponentFailed):
    """The pod did not start or get ready; the message ends with its log."""


@dataclass
class Pod:
    """One running pod (a podman container, or a local process)."""

    name: str
    namespace: str
    container: dict[str, Any]
    volumes_dir: Path
    container_id: str = ""
    process: subprocess.Popen[bytes] | None = None
    log_file: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    ip: str = "127.0.0.1"  # where it listens (its status.podIP when it has its own)
    # kubelet_volumes: (volume, host directory, fsGroup) of each secret/configMap volume, refreshed by sync_volumes
    synced_volumes: Synced = field(default_factory=list)

    def port(self, name: str) -> int:
        return self.ports[name]

    def logs(self) -> str:
        if self.container_id:
            proc = podman("logs", self.container_id, check=False, timeout=30)
            return (proc.stdout + proc.stderr).decode(errors="replace")
        return self.log_file.read_text(errors="replace") if self.log_file and self.log_file.exists() else ""

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        proc = podman("inspect", "--format", "{{.State.Running}}", self.container_id, check=False, timeout=30)
        return proc.stdout.decode().strip() == "true"

    def ready(self) -> bool:
        """The readinessProbe: its httpGet path on its (named) port answers 2xx."""
        readiness = self.container.get("readinessProbe") or {}
        probe = readiness.get("httpGet") or {}
        port = probe.get("port", 0)
        number = self.ports[port] if isinstance(port, str) else int(port)
        url = f"http://{self.ip}:{number}{probe.get('path', '/')}"
        try:
            return 200 <= httpx.get(url, timeout=float(readiness.get("timeoutSeconds", 2))).status_code < 300
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float | str = "pod-ready") -> None:
        def ready() -> bool:
            if not self.running():
                raise PodFailed(f"pod {self.namespace}/{self.name} exited:\n{self.logs()[-3000:]}")
            return self.ready()

        try:
            wait_for(ready, timeout, f"pod {self.namespace}/{self.name} ready", interval=0.2)
        except AssertionError as exc:
            raise PodFailed(f"{exc}\n{self.logs()[-3000:]}") from None

    def sync_volumes(self, cp: ControlPlane) -> list[str]:
        """kubelet's refresh of secret and configMap volumes: publish what changed atomically; the names of those
        volumes."""
        changed: list[str] = []
        for volume, target, fs_group in self.synced_volumes:
            found = volume_files(cp, self.namespace, volume)
            if found is not None and atomic_write(target, *found, fs_group):
                changed.append(volume["name"])
        return changed

    def stop(self, grace: float = 5.0) -> None:
        """Stop it (SIGTERM, then SIGKILL after ``grace`` s) and remove the container; by container ID or PID."""
        if self.container_id:
            podman("stop", "-t", str(max(0, round(grace))), self.container_id, check=False, timeout=grace + 60)
            podman("rm", "-f", self.container_id, check=False, timeout=60)
        elif self.process is not None:
            stop_process(self.process, grace)

    def exec(self, command: list[str], timeout: float) -> int:
        """Run ``command`` in the container (``podman exec``; for a process pod, on the host), as an exec hook is
        run; its exit code (-1 when it ran out of ``timeout``)."""
        try:
            if self.container_id:
                return podman("exec", self.container_id, *command, check=False, timeout=timeout).returncode
            return subprocess.run(command, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            return -1

    def terminate(self, grace_seconds: float) -> dict[str, float]:
        """What kubelet does to a container of a deleted pod: the ``preStop`` exec hook, then SIGTERM, then SIGKILL
        when ``grace_seconds`` (the pod's ``terminationGracePeriodSeconds``, counted from the hook's start) are
        over. Returns how long the hook and the stop took."""
        started = time.monotonic()
        hook = ((self.container.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if hook and self.running():
            self.exec(list(hook["command"]), timeout=grace_seconds)
        hooked = time.monotonic()
        self.stop(grace=max(2.0, grace_seconds - (hooked - started)))  # kubelet gives at least 2 s after the hook
        return {"pre_stop": hooked - started, "stop": time.monotonic() - hooked}


def _env(
    container: dict[str, Any], namespace: str, pod_name: str, cp: ControlPlane, pod_ip: str = "127.0.0.1"
) -> dict[str, str]:
    env: dict[str, str] = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cp.port)}
    fields = {
        "metadata.namespace": namespace,
        "metadata.name": pod_name,
        "status.podIP": pod_ip,
        "status.hostIP": "127.0.0.1",
    }
    for item in container.get("env") or []:
        if "value" in item or "valueFrom" not in item:  # the API server drops an empty value from a stored Pod
            env[item["name"]] = str(item.get("value", ""))
        elif "fieldRef" in (item.get("valueFrom") or {}):
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            raise PodFailed(f"env {item['name']}: only value and fieldRef ({', '.join(fields)}) are supported here")
    return env


def _pod_parts(deployment: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    return pod_spec, container


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports") or []}


def _security_args(pod_spec: dict[str, Any], container: dict[str, Any], name: str) -> list[str]:
    """podman's equivalents of the pod's and container's securityContext."""
    security = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    if security.get("runAsNonRoot") and int(security.get("runAsUser", 0)) == 0:
        raise PodFailed(f"{name}: runAsNonRoot with uid 0 would not start")
    args: list[str] = []
    if "runAsUser" in security:
        args += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}"]
    if "fsGroup" in (pod_spec.get("securityContext") or {}):
        args += ["--group-add", str(pod_spec["securityContext"]["fsGroup"])]
    if security.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]  # writable: only the pod's own volumes
    drop = (security.get("capabilities") or {}).get("drop") or []
    if "ALL" in drop:
        args.append("--cap-drop=all")
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    return args


def _podman_run(
    name: str,
    hostname: str,
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    image: str,
    mounts: dict[str, Path],
    tmpfs: list[str],
    env: dict[str, str],
    read_only: dict[str, bool],
) -> list[str]:
    """``podman run`` arguments for one container on the host network: its securityContext, volumes, env."""
    args = ["run", "-d", "--name", name, "--network=host", "--hostname", hostname]
    args += _security_args(pod_spec, container, name)
    for path, host in mounts.items():
        args += ["-v", f"{host}:{path}:{'ro' if read_only.get(path, True) else 'rw'}"]
    for path in tmpfs:
        args += ["--tmpfs", f"{path}:rw,size=64m,mode=1777"]
    for key, value in env.items():
        args += ["-e", f"{key}={value}"]
    if container.get("command"):
        args += ["--entrypoint", json.dumps(container["command"])]
    return [*args, image, *(container.get("args") or [])]


def run_pod(
    cp: ControlPlane,
    deployment: dict[str, Any],
    image: str,
    workdir: Path,
    ready_timeout: float | str = "pod-ready",
    kubelet_volumes: bool = False,
    pod: dict[str, Any] | None = None,
    pod_ip: str = "127.0.0.1",
) -> Pod:
    """Run the Deployment's pod template with podman on the host network; return once it is ready.

    ``kubelet_volumes``: secret and configMap volumes in kubelet's atomic layout, refreshable with
    :meth:`Pod.sync_volumes` (see the module doc). ``pod``: a Pod object to run instead (its name,
    its spec, its container's image; ``deployment`` is then not read), listening on ``pod_ip``;
    ``ready_timeout=0`` returns at once (the caller probes).
    """
    namespace, name, pod_spec, container = _identity(deployment, pod)
    if pod is not None:
        image = container["image"]  # what kubelet runs: the pod's own image (pullPolicy Never: it must be here)
    token = cp.api.token(namespace, pod_spec["serviceAccountName"])
    root = workdir / name
    synced: Synced = []
    mounts, tmpfs = materialize(cp, namespace, pod_spec, container, token, root, synced if kubelet_volumes else None)
    env = _env(container, namespace, name, cp, pod_ip)
    read_only = {m["mountPath"]: bool(m.get("readOnly")) for m in container.get("volumeMounts") or []}
    read_only.setdefault(SA_DIR, True)
    read_only = {path: read_only.get(path, False) for path in mounts}
    started = podman(*_podman_run(name, name, pod_spec, container, image, mounts, tmpfs, env, read_only), timeout=120)
    container_id = started.stdout.decode().strip()
    running = Pod(name, namespace, container, root, container_id, ports=_ports(container), ip=pod_ip)
    running.synced_volumes = synced
    return _await_ready(running, ready_timeout)


def _script(container: dict[str, Any]) -> list[str]:
    """The container's command line with its console script found beside this Python (else on PATH)."""
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    script = Path(sys.executable).parent / command[0]
    command[0] = str(script) if script.exists() else (shutil.which(command[0]) or command[0])
    return command


def _token_kubeconfig(cp: ControlPlane, path: Path, token: str, service_account: str) -> Path:
    return cp.credentials.with_token(token).write_kubeconfig(path, service_account)


def run_process(
    cp: ControlPlane,
    deployment: dict[str, Any],
    workdir: Path,
    ready_timeout: float | str = "pod-ready",
    kubelet_volumes: bool = False,
    pod: dict[str, Any] | None = None,
    pod_ip: str = "127.0.0.1",
) -> Pod:
    """The inner-loop variant: the pod's console script as a local process, same env, token and files."""
    namespace, name, pod_spec, container = _identity(deployment, pod)
    token = cp.api.token(namespace, pod_spec["serviceAccountName"])
    root = workdir / name
    synced: Synced = []
    mounts, _ = materialize(cp, namespace, pod_spec, container, token, root, synced if kubelet_volumes else None)
    env = _env(container, namespace, name, cp, pod_ip)
    for key, value in list(env.items()):  # paths under a mountPath point at the materialized copy
        for path, host in mounts.items():
            if value.startswith(path.rstrip("/") + "/"):
                env[key] = str(host) + value[len(path.rstrip("/")) :]
    kubeconfig = _token_kubeconfig(cp, root / "token.kubeconfig", token, pod_spec["serviceAccountName"])
    env["KUBECONFIG"] = str(kubeconfig)
    log_file = root / "process.log"
    proc = spawn(_script(container), log_file, env={**os.environ, **env})
    running = Pod(name, namespace, container, root, process=proc, log_file=log_file, ports=_ports(container), ip=pod_ip)
    running.synced_volumes = synced
    return _await_ready(running, ready_timeout)


def _identity(
    deployment: dict[str, Any], pod: dict[str, Any] | None
) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """Namespace, name, pod spec and container: of the Pod object when there is one, else of a new pod of the
    Deployment's template."""
    if pod is not None:
        (container,) = pod["spec"]["containers"]
        return pod["metadata"]["namespace"], pod["metadata"]["name"], pod["spec"], container
    pod_spec, container = _pod_parts(deployment)
    name = f"{deployment['metadata']['name']}-{os.urandom(3).hex()}"
    return deployment["metadata"]["namespace"], name, pod_spec, container


def _await_ready(pod: Pod, timeout: float | str) -> Pod:
    if timeout == 0:
        return pod
    try:
        pod.wait_ready(timeout)
    except PodFailed:
        pod.stop()
        raise
    return pod


@dataclass(frozen=True)
class Completed:
    """A pod that ran to its end: its container's exit code and its log."""

    exit_code: int
    logs: str


def run_to_completion(
    cp: ControlPlane, pod: dict[str, Any], image: str, workdir: Path, timeout: float = 120.0
) -> Completed:
    """Run a Pod object's one container with podman, as the kubelet would, until it exits (a ``helm test`` hook).

    The same materialization as :func:`run_pod` (its ServiceAccount's token and the in-cluster
    environment, its securityContext, its volumes); then, like the kubelet, the Pod's status is
    written back (``Succeeded`` or ``Failed`` with the container's exit code), which is what
    ``helm test`` waits for.
    """
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    pod_spec = pod["spec"]
    (container,) = pod_spec["containers"]
    token = cp.api.token(namespace, pod_spec.get("serviceAccountName") or "default")
    root = workdir / f"{name}-{os.urandom(3).hex()}"
    mounts, tmpfs = materialize(cp, namespace, pod_spec, container, token, root)
    env = _env(container, namespace, name, cp)
    read_only = dict.fromkeys(mounts, True)
    args = _podman_run(root.name, name, pod_spec, container, image, mounts, tmpfs, env, read_only)
    container_id = podman(*args, timeout=120).stdout.decode().strip()
    try:
        waited = podman("wait", container_id, timeout=timeout)
        code = int(waited.stdout.decode().strip().splitlines()[-1])
        logs = podman("logs", container_id, check=False, timeout=30)
        text = (logs.stdout + logs.stderr).decode(errors="replace")
    finally:
        podman("rm", "-f", container_id, check=False, timeout=60)
    _report_exit(cp, pod, image, code)
    return Completed(code, text)


def _report_exit(cp: ControlPlane, pod: dict[str, Any], image: str, code: int) -> None:
    """What the kubelet writes when a pod's only container ended: the phase and the exit code."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    phase = "Succeeded" if code == 0 else "Failed"
    status = {
        "phase": phase,
        "containerStatuses": [
            {
                "name": container["name"],
                "image": image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}},
            }
        ],
    }
    cp.api.patch("v1", "pods", namespace, name, {"status": status}, "status")


def run_process_to_completion(
    cp: ControlPlane, pod: dict[str, Any], workdir: Path, timeout: float = 120.0
) -> Completed:
    """The inner-loop variant of :func:`run_to_completion`: the container's command as a local process,
    with its ServiceAccount's token in a kubeconfig."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    service_account = pod["spec"].get("serviceAccountName") or "default"
    token = cp.api.token(namespace, service_account)
    root = workdir / f"{name}-{os.urandom(3).hex()}"
    root.mkdir(parents=True, exist_ok=True)
    kubeconfig = _token_kubeconfig(cp, root / "token.kubeconfig", token, service_account)
    env = {**os.environ, **_env(container, namespace, name, cp), "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.run(
        _script(container), env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    _report_exit(cp, pod, "process", proc.returncode)
    return Completed(proc.returncode, proc.stdout + proc.stderr)


class VolumeSync:
    """kubelet's periodic pod sync, for the volumes only: :meth:`Pod.sync_volumes` of each pod every ``period`` s.

    A real kubelet refreshes secret and configMap volumes on its pod sync (``syncFrequency``, 1 min
    by default, jittered), so a renewed Secret reaches a pod up to about a minute after it is
    stored; ``period`` is that delay here. ``events`` records (monotonic time, pod, volume) of each
    refresh.
    """

    def __init__(self, cp: ControlPlane, pods: list[Pod], period: float) -> None:
        self.cp, self.pods, self.period = cp, pods, period
        self.events: list[tuple[float, str, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volume-sync", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            for pod in self.pods:
                try:
                    for volume in pod.sync_volumes(self.cp):
                        self.events.append((time.monotonic(), pod.name, volume))
                except Exception as exc:  # noqa: BLE001 - the API server may be restarting; kubelet retries too
                    self.errors.append(f"{pod.name}: {type(exc).__name__}: {exc}")

    def __enter__(self) -> VolumeSync:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
