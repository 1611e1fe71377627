"""RBAC covers the code: every API call the services made in this run is allowed by the chart.

The emulators record each request with its User-Agent (``slime-injection-webhook`` or
``slime-scaling-webhook``). This module sorts after every test folder, so it sees the calls of the
whole run. It renders the chart and asks the RBAC evaluator about each recorded call. For the
scaling webhook, whose Roles are narrowed to the mapped objects, the chart is rendered with the
mappings the tests used (read back from the recorded calls). That exercises the same narrowing
an operator's values produce.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import yaml

from kubemu import RecordedRequest
from tests.conftest import RECORDED_CALLS
from tests.support.helm import REPO_ROOT, helm_binary
from tests.support.rbac import ApiRequest, assert_rbac_covers

RELEASE, NAMESPACE = "slime", "slime"


def as_rbac_request(call: RecordedRequest) -> ApiRequest:
    if call.non_resource:
        return ApiRequest(call.verb, non_resource=call.path)
    name = call.name
    field_selector = parse_qs(call.query).get("fieldSelector", [""])[0]
    if call.verb in ("list", "watch") and field_selector.startswith("metadata.name=") and "," not in field_selector:
        name = field_selector.removeprefix("metadata.name=")
    return ApiRequest(call.verb, call.api_group, call.resource, call.subresource, call.namespace, name)


def calls_by(user_agent: str) -> list[ApiRequest]:
    return sorted({as_rbac_request(c) for c in RECORDED_CALLS if c.user_agent.startswith(user_agent)}, key=str)


def render(values: dict, tmp_path: Path, namespace: str) -> list[dict]:
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    out = subprocess.run(
        [str(helm_binary()), "template", RELEASE, str(REPO_ROOT / "charts" / "slime"), "-n", namespace, "-f", str(values_file)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    return [d for d in yaml.load_all(out, Loader=yaml.CSafeLoader) if d]


def scaling_values(calls: list[ApiRequest]) -> dict:
    """Mappings naming exactly the mirrors and MachineDeployments the recorded calls touched."""
    mirrors = sorted({(c.namespace, c.name) for c in calls if c.resource == "deployments" and c.name})
    mds = sorted({(c.namespace, c.name) for c in calls if c.resource == "machinedeployments" and c.name})
    count = max(len(mirrors), len(mds), 1)
    mappings = []
    for i in range(count):
        mirror = mirrors[i] if i < len(mirrors) else (NAMESPACE, f"unobserved-mirror-{i}")
        md = mds[i] if i < len(mds) else (mds or [("default", "unobserved-md")])[0]
        mappings.append({"mirror": {"namespace": mirror[0], "name": mirror[1]},
                         "machineDeployment": {"namespace": md[0], "name": md[1]}})
    jwt_secrets = sorted({(c.namespace, c.name) for c in calls if c.resource == "secrets" and c.name})
    safe_scale_in = {"enabled": True, "jwtSecrets": [{"namespace": ns, "name": name} for ns, name in jwt_secrets]}
    return {"scaling": {"mappings": mappings, "safeScaleIn": safe_scale_in}}


def test_injection_rbac_covers_every_recorded_call(tmp_path: Path) -> None:
    calls = calls_by("slime-injection-webhook")
    if not calls:
        pytest.skip("no injection-webhook API calls were recorded in this run (run the whole suite)")
    assert_rbac_covers(render({}, tmp_path, NAMESPACE), f"{RELEASE}-injection-webhook", NAMESPACE, calls)


def test_scaling_rbac_covers_every_recorded_call(tmp_path: Path) -> None:
    calls = calls_by("slime-scaling-webhook")
    if not calls:
        pytest.skip("no scaling-webhook API calls were recorded in this run (run the whole suite)")
    values = scaling_values(calls)
    # Each test ran the service in some namespace with some ConfigMap name: render the release
    # there with that name (``scaling.configMapName``), as an operator's values would.
    config_maps = sorted({(c.namespace, c.name) for c in calls if c.resource == "configmaps"}) or [(NAMESPACE, "")]
    for namespace, config_map in config_maps:
        own = [c for c in calls if c.resource != "configmaps" or (c.namespace, c.name) == (namespace, config_map)]
        release_values = {"scaling": {**values["scaling"], **({"configMapName": config_map} if config_map else {})}}
        assert_rbac_covers(render(release_values, tmp_path, namespace), f"{RELEASE}-scaling-webhook", namespace, own)
