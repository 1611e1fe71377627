"""What an operator sees from a real ``injection-webhook`` process: plain JSON log lines, one
"serving" line, a reason on every admission it acts on, and ``/metrics`` without ``_created``.

The process is started the way CONTRIBUTING.md's "Running the services yourself" steps start it:
a dev certificate from ``slime-dev-certs`` (valid for localhost and 127.0.0.1) and a kubeconfig.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx

from certs.devcerts import main as dev_certs
from common.logs import configure_logging
from kubemu import Emulator
from testbed.framework.objects import SLURM_BINDINGS, metadata_secret
from testbed.framework.ports import free_port
from testbed.framework.reviews import secret_request
from testbed.framework.wait import wait_for
from testbed.framework.world import seed_metal3, seed_nodeport, seed_slinky


def test_logs_are_plain_json_once_each_and_every_admission_says_why(emulator: Emulator, tmp_path: Path) -> None:
    seed_slinky(emulator)
    seed_nodeport(emulator, "slurm", "slurm")
    _, data = seed_metal3(emulator, template_labels={"slurm-controller-namespace": "slurm"})
    certs = tmp_path / "certs-dev"
    dev_certs(["--out", str(certs), "--dns", "localhost"])
    port, metrics_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "injection_webhook.main",
            "--kubeconfig",
            emulator.write_kubeconfig(tmp_path / "kubeconfig"),
            "--cert-file",
            str(certs / "tls.crt"),
            "--key-file",
            str(certs / "tls.key"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--slurm-bindings",
            SLURM_BINDINGS,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return process.poll() is not None

        wait_for(ready, 30, "injection-webhook /readyz")
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        # The dev certificate is valid for both names CONTRIBUTING.md uses.
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        for host in ("localhost", "127.0.0.1"):
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": f"uid-{host}", **secret_request(metadata_secret(data))},
            }
            answer = httpx.post(f"https://{host}:{port}/mutate", json=review, verify=context, timeout=10).json()[
                "response"
            ]
            assert answer["patchType"] == "JSONPatch"
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out == ""
    lines = err.splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert "\x1b[" not in err, "ANSI escape codes in the log"
    assert not any("color_message" in record for record in records)
    messages = [record["msg"] for record in records]
    assert messages.count("serving") == 1
    assert not any(message.startswith("Started server process") for message in messages), messages
    admissions = [record for record in records if record["msg"] == "admission"]
    assert [a["uid"] for a in admissions] == ["uid-localhost", "uid-127.0.0.1"]
    for admission in admissions:
        assert admission["decision"] == "patched"
        assert (
            admission["reason"]
            == "added the Slurm join data for slurmctld 192.0.2.10:30817 to Secret metal3/m3m-0-metadata"
        )
    assert "_created" not in metrics
    assert 'slime_webhook_requests_total{outcome="patched",webhook="injection"} 2.0' in metrics


def test_http_client_requests_are_logged_only_at_debug() -> None:
    """The demand poller calls slurmrestd every second: httpx's per-request INFO line must not flood the log."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        for level, shown in (("INFO", False), ("DEBUG", True), ("INFO", False)):
            stream = io.StringIO()
            configure_logging(level, stream)
            logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1:6820/slurm/v0.0.42/jobs/ 200 OK")
            logging.getLogger("httpx").warning("a warning always shows")
            assert ("HTTP Request" in stream.getvalue()) is shown, (level, stream.getvalue())
            assert "a warning always shows" in stream.getvalue()
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logging.getLogger("httpx").setLevel(logging.NOTSET)
