"""End-of-session audits: RBAC covers every API call the services made, and no secret leaked.

Both run at the end of *every* test session that started a service (``tests/conftest.py``
calls them from a session fixture's teardown), whatever tests were selected: ``pytest
tests/scaling`` audits the calls the scaling tests made. An audit with nothing to check while
services were started is a failure, not a skip.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import yaml

from common.logs import JsonFormatter
from kubemu import RecordedRequest
from testbed.framework.chart import NAMESPACE, RELEASE
from testbed.framework.helm import helm_binary
from testbed.framework.paths import CHART
from testbed.framework.rbac import ApiRequest, assert_rbac_covers

# Every API call made to a *management-cluster* emulator during this session (the emulator
# fixtures and the demo tests add them). The RBAC audit checks each one the services made.
RECORDED_CALLS: list[RecordedRequest] = []
USER_AGENTS = {
    "injection-webhook": "slime-injection-webhook",
    "scaling-webhook": "slime-scaling-webhook",
    "teardown": "slime-teardown",  # the chart's pre-delete hook Job
}


# --- RBAC ---------------------------------------------------------------------------------------


def as_rbac_request(call: RecordedRequest) -> ApiRequest:
    if call.non_resource:
        return ApiRequest(call.verb, non_resource=call.path)
    name = call.name
    field_selector = parse_qs(call.query).get("fieldSelector", [""])[0]
    if call.verb in ("list", "watch") and field_selector.startswith("metadata.name=") and "," not in field_selector:
        name = field_selector.removeprefix("metadata.name=")
    return ApiRequest(call.verb, call.api_group, call.resource, call.subresource, call.namespace, name)


def calls_by(calls: Iterable[RecordedRequest], user_agent: str) -> list[ApiRequest]:
    return sorted({as_rbac_request(c) for c in calls if c.user_agent.startswith(user_agent)}, key=str)


def render(values: dict[str, Any], workdir: Path, namespace: str) -> list[dict[str, Any]]:
    values_file = workdir / f"values-{namespace}.json"
    values_file.write_text(json.dumps(values))
    proc = subprocess.run(
        [
            str(helm_binary()),
            "template",
            RELEASE,
            str(CHART),
            "-n",
            namespace,
            "-f",
            str(values_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"helm template with {values_file.name} failed: {proc.stderr.strip()}"
    return [d for d in yaml.load_all(proc.stdout, Loader=yaml.CSafeLoader) if d]


def scaling_values(calls: list[ApiRequest]) -> dict[str, Any]:
    """Mappings naming exactly the mirrors and MachineDeployments the recorded calls touched."""
    mirrors = sorted({(c.namespace, c.name) for c in calls if c.resource == "deployments" and c.name})
    mds = sorted({(c.namespace, c.name) for c in calls if c.resource == "machinedeployments" and c.name})
    count = max(len(mirrors), len(mds), 1)
    mappings = []
    for i in range(count):
        mirror = mirrors[i] if i < len(mirrors) else (NAMESPACE, f"unobserved-mirror-{i}")
        # The chart allows one writer per MachineDeployment: pad with distinct ones, never a repeat.
        md = mds[i] if i < len(mds) else ("default", f"unobserved-md-{i}")
        mappings.append(
            {
                "mirror": {"namespace": mirror[0], "name": mirror[1]},
                "machineDeployment": {"namespace": md[0], "name": md[1]},
                "maxReplicas": 10,
            }
        )
    jwt_secrets = sorted({(c.namespace, c.name) for c in calls if c.resource == "secrets" and c.name})
    safe_scale_in = {"enabled": True, "jwtSecrets": [{"namespace": ns, "name": name} for ns, name in jwt_secrets]}
    capacity_aware = {"enabled": any(c.resource == "baremetalhosts" for c in calls)}
    judged = any(c.resource == "machines" and (c.subresource == "status" or c.verb == "delete") for c in calls)
    slurm_health = {"enabled": judged, "jwtSecrets": safe_scale_in["jwtSecrets"] if judged else []}
    return {
        "scaling": {
            "mappings": mappings,
            "safeScaleIn": safe_scale_in,
            "capacityAware": capacity_aware,
            "slurmHealth": slurm_health,
        }
    }


def injection_values(calls: list[ApiRequest]) -> dict[str, Any]:
    """The operator's values that make these calls legitimate: the key Secrets read by name, and a workload
    binding for each namespace whose kubeconfig Secret was read (the RBAC must follow the bindings)."""
    secrets = {(c.namespace, c.name) for c in calls if c.resource == "secrets" and c.name}
    kubeconfigs = sorted({ns for ns, name in secrets if name.endswith("-kubeconfig")})
    keys = sorted({name for _, name in secrets if not name.endswith("-kubeconfig")})
    injection: dict[str, Any] = {"slurmBindings": [f"{ns}=workload:slurm" for ns in kubeconfigs]}
    if keys:
        injection["slurmKeySecretNames"] = keys
    return {"injection": injection}


def audit_injection(calls: list[ApiRequest], workdir: Path) -> None:
    values = injection_values(calls)
    assert_rbac_covers(render(values, workdir, NAMESPACE), f"{RELEASE}-injection-webhook", NAMESPACE, calls)


def audit_scaling(calls: list[ApiRequest], workdir: Path) -> None:
    values = scaling_values(calls)
    # Each test ran the service in some namespace with some ConfigMap name: render the release
    # there with that name (``scaling.configMapName``), as an operator's values would.
    config_maps = sorted({(c.namespace, c.name) for c in calls if c.resource == "configmaps"}) or [(NAMESPACE, "")]
    for namespace, config_map in config_maps:
        own = [c for c in calls if c.resource != "configmaps" or (c.namespace, c.name) == (namespace, config_map)]
        release_values = {"scaling": {**values["scaling"], **({"configMapName": config_map} if config_map else {})}}
        assert_rbac_covers(render(release_values, workdir, namespace), f"{RELEASE}-scaling-webhook", namespace, own)


def audit_teardown(calls: list[ApiRequest], workdir: Path) -> None:
    """The hook's calls against its own hook-scoped RBAC, rendered with the pools and Secrets it touched."""
    values = scaling_values(calls)
    assert_rbac_covers(render(values, workdir, NAMESPACE), f"{RELEASE}-teardown", NAMESPACE, calls)


AUDITS = {"injection-webhook": audit_injection, "scaling-webhook": audit_scaling, "teardown": audit_teardown}


def audit_rbac(recorded: list[RecordedRequest], started: set[str], workdir: Path) -> dict[str, int]:
    """Check every recorded call of each started service against the rendered chart; calls checked per service."""
    checked = {}
    for service, user_agent in USER_AGENTS.items():
        calls = calls_by(recorded, user_agent)
        if service in started and not calls:
            raise AssertionError(
                f"RBAC audit: {service} was started in this session but no API call of it was recorded"
            )
        if calls:
            AUDITS[service](calls, workdir)
        checked[service] = len(calls)
    return checked


# --- secrets ------------------------------------------------------------------------------------


@dataclass
class Evidence:
    """What must never contain a secret: log lines, metrics pages, error texts, seen by the whole session."""

    log_lines: list[str] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (where, text)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_text(self, where: str, text: str) -> None:
        with self.lock:
            self.texts.append((where, text))

    def add_line(self, line: str) -> None:
        with self.lock:
            self.log_lines.append(line)


class EvidenceHandler(logging.Handler):
    """Every log record, formatted by the services' production formatter, into :class:`Evidence`."""

    def __init__(self, evidence: Evidence) -> None:
        super().__init__(logging.DEBUG)
        self.evidence = evidence
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - a formatter failure is itself evidence
            line = f"FORMAT FAILURE {record.getMessage()!r}"
        self.evidence.add_line(line)


def secret_forms(secret: bytes) -> list[str]:
    """The ways a secret could show up: raw (when it is text) and base64."""
    forms = [base64.b64encode(secret).decode()]
    try:
        forms.append(secret.decode())
    except UnicodeDecodeError:
        pass
    return forms


def leaks(evidence: Evidence, secrets: Iterable[bytes]) -> list[str]:
    """Every log line or text in which one of ``secrets`` appears."""
    found: list[str] = []
    for secret in secrets:
        for form in secret_forms(secret):
            found += [f"log line: {line[:300]}" for line in evidence.log_lines if form in line]
            found += [f"{where}: {text[:300]}" for where, text in evidence.texts if form in text]
    return found


# Everything the session's tests saw that must not hold a secret; tests add the texts they read.
EVIDENCE = Evidence()


def scan_logs(where: str, logs: dict[str, str]) -> None:
    """Hand the daemons' logs to the session's secret scan: no key may appear in them."""
    for name, text in logs.items():
        EVIDENCE.add_text(f"{where} {name}", text)
