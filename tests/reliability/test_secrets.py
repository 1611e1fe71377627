"""No ``slurm.key`` in any log line, metrics page or error text, even at DEBUG with requests that carry it.

:data:`EVIDENCE` holds every JSON log line of the session so far (through
``common.logs.JsonFormatter``), every metrics page and every denial message the tests read. This
test runs its own scenario at DEBUG level (the most talkative setting), with requests that carry
the key themselves, then scans what the session has seen. The same scan runs again over the
whole session at its end (``tests/conftest.py``), whatever the order of the tests.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from kubemu import Emulator
from testbed.framework.audit import EVIDENCE, leaks
from testbed.framework.objects import SLIME_NAMESPACE, b64, metadata_secret
from testbed.framework.pki import Pki
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.world import issued_secrets, seed_metal3
from testbed.scenarios.reliability import Services, seed_injection_cluster, seed_scaling_cluster


def _review(service: Any, secret: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    response = service.review("/mutate", secret_request(secret, operation))
    if response.get("status", {}).get("message"):
        EVIDENCE.add_text("injection answer", response["status"]["message"])
    return response


def test_no_slurm_key_in_logs_metrics_or_errors(
    emulator: Emulator, pki: Pki, tmp_path: Path, figures: dict[str, Any]
) -> None:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    services = Services(pki, tmp_path)
    try:
        slurm, data = seed_injection_cluster(emulator)
        seed_scaling_cluster(emulator)
        injection = services.injection(emulator, log_level="DEBUG")
        scaling = services.scaling(emulator, log_level="DEBUG")
        secret = metadata_secret(data)
        first = _review(injection, secret)
        assert first["patchType"] == "JSONPatch"

        # Requests that carry the key: an already injected Secret (UPDATE), one with stale values, one
        # whose metaData is broken YAML around the key, and the key where a name should be.
        key64 = b64(slurm.key)
        injected = metadata_secret(data)  # as the first admission left it: every join key present
        injected["data"]["metaData"] = json.loads(base64.b64decode(first["patch"]))[0]["value"]
        assert "patch" not in _review(injection, injected, "UPDATE")
        stale = metadata_secret(data, extra={"slurm_controller_host": "198.51.100.9", "slurm_key_base64": key64})
        assert _review(injection, stale, "UPDATE")["patchType"] == "JSONPatch"
        broken = metadata_secret(data)
        broken["data"]["metaData"] = b64(f"local-hostname: m3m-0\nslurm_key_base64: [{key64}\n: {slurm.key.decode()}")
        assert _review(injection, broken)["status"]["code"] == 400
        named = metadata_secret(data)
        named["metadata"]["ownerReferences"][0]["name"] = key64[:200]
        # Not a valid Kubernetes name, so it cannot name a Metal3Data: not ours, allowed untouched.
        assert "patch" not in _review(injection, named)
        # A template that opts in to a controller that does not exist: a denial naming what is missing.
        _, other = seed_metal3(
            emulator,
            template="other-workers",
            index=9,
            template_labels={"slurm-controller-namespace": "slurm", "slurm-controller-name": "missing"},
        )
        assert _review(injection, metadata_secret(other, machine="m3m-9"))["allowed"] is False
        # The scaling webhook never sees the key, but its logs are part of the check too.
        assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3, old_replicas=2))["allowed"] is True
        assert (
            yaml.safe_load(base64.b64decode(json.loads(base64.b64decode(first["patch"]))[0]["value"]))[
                "slurm_key_base64"
            ]
            == key64
        )
    finally:
        services.close()  # keeps each service's metrics page as evidence
        root.setLevel(level)

    keys = issued_secrets()
    assert slurm.key in keys, "the seeded key was registered"
    found = leaks(EVIDENCE, keys)
    redacted = sum("[REDACTED]" in line for line in EVIDENCE.log_lines)
    figures["secrets"] = {
        "keys_checked": len(keys),
        "log_lines_scanned": len(EVIDENCE.log_lines),
        "metrics_pages_and_error_texts_scanned": len(EVIDENCE.texts),
        "log_lines_redacted_by_the_redactor": redacted,
        "leaks": len(found),
    }
    assert not found, "\n".join(found[:10])
    assert any('"logger":"slime.admission"' in line for line in EVIDENCE.log_lines), "the admission logs were captured"
