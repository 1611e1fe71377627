"""Every bad flag, variable, certificate file, kubeconfig, port clash or address: exit 2 with one line naming the
setting.

Both console scripts share :func:`common.cli.run_service`. The table runs each bad configuration
through the real ``main`` of a service; two cases also run as separate processes, to show the
whole of stderr is that one line (no traceback, no log noise).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from injection_webhook.main import main as injection_main
from scaling_webhook.main import main as scaling_main
from testbed.framework.pki import Pki, make_pki
from testbed.framework.ports import free_port

ENV = (
    "SLIME_PORT",
    "SLIME_METRICS_PORT",
    "SLIME_HOST",
    "SLIME_CONFIG_MAP",
    "POD_NAMESPACE",
    "NAMESPACE",
    "KUBECONFIG",
    "SLIME_LOG_LEVEL",
    "SLIME_CONTROLLER_SELECTOR",
    "SLIME_CLIENT_CA_FILE",
    "SLIME_CONF_SERVER_POLICY",
    "SLIME_CONF_SERVER_NODE_ADDRESSES",
    "SLIME_EXTRA_JOIN_DATA",
)


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A valid serving pair: every case but the certificate ones gets past the certificate check."""
    return make_pki(tmp_path_factory.mktemp("serving"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, serving: Pki) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLIME_CERT_FILE", str(serving.cert_file))
    monkeypatch.setenv("SLIME_KEY_FILE", str(serving.key_file))


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``main`` configures the process's logging (JSON on stderr) before a late failure; put the session's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def _kubeconfig_text(tmp_path: Path) -> str:
    path = tmp_path / "not-a-kubeconfig"
    path.write_text("just a line of text\n")
    return str(path)


CASES = [
    # (service, argv, env, the field named, a fragment of the reason)
    ("injection", ["--kubeconfig", "/etc/hostname"], {}, "--kubeconfig (env KUBECONFIG)", "is not a kubeconfig"),
    (
        "injection",
        ["--kubeconfig", "/nonexistent/kubeconfig"],
        {},
        "--kubeconfig (env KUBECONFIG)",
        "No such file or directory",
    ),
    ("injection", ["--port", "0"], {}, "--port (env SLIME_PORT)", "greater than or equal to 1"),
    ("injection", ["--port", "65536"], {}, "--port (env SLIME_PORT)", "less than or equal to 65535"),
    (
        "injection",
        ["--port", "8443", "--metrics-port", "8443"],
        {},
        "--port and --metrics-port are both 8443",
        "must differ",
    ),
    ("injection", ["--host", "999.1.1.1"], {}, "--host (env SLIME_HOST)", "'999.1.1.1' is not an IP address"),
    (
        "injection",
        ["--log-level", "loud"],
        {},
        "--log-level (env SLIME_LOG_LEVEL)",
        "'DEBUG', 'INFO', 'WARNING' or 'ERROR'",
    ),
    (
        "injection",
        ["--controller-selector", "app name=x"],
        {},
        "--controller-selector (env SLIME_CONTROLLER_SELECTOR)",
        "not a valid label selector requirement",
    ),
    (
        "injection",
        ["--conf-server-policy", "slurm_ctld:6817"],
        {},
        "--conf-server-policy (env SLIME_CONF_SERVER_POLICY)",
        "'slurm_ctld:6817' is not a conf-server policy: the host is neither an IP address nor an RFC 1123 host name",
    ),
    (
        "injection",
        [],
        {"SLIME_CONF_SERVER_POLICY": "slurmctld:70000"},
        "--conf-server-policy (env SLIME_CONF_SERVER_POLICY)",
        "the port '70000' is not a number in 1-65535",
    ),
    (
        "injection",
        ["--conf-server-node-addresses", "192.0.2.1,node_2"],
        {},
        "--conf-server-node-addresses (env SLIME_CONF_SERVER_NODE_ADDRESSES)",
        "node address 'node_2': the host is neither",
    ),
    (
        "injection",
        ["--extra-join-data", "jwt-key,munge-key"],
        {},
        "--extra-join-data (env SLIME_EXTRA_JOIN_DATA)",
        "unknown item 'munge-key'; the items are controller-name, jwt-key",
    ),
    ("injection", ["--no-such-flag", "1"], {}, "unrecognized arguments: --no-such-flag 1", ""),
    ("injection", [], {"SLIME_PORT": "https"}, "--port (env SLIME_PORT)", "valid integer"),
    (
        "scaling",
        [],
        {"POD_NAMESPACE": "Bad_NS"},
        "--namespace (env POD_NAMESPACE)",
        "'Bad_NS' is not a valid namespace name",
    ),
    (
        "scaling",
        [],
        {"SLIME_CONFIG_MAP": "Bad/Name"},
        "--config-map (env SLIME_CONFIG_MAP)",
        "'Bad/Name' is not a valid object name",
    ),
    ("scaling", ["--resync-seconds", "0"], {}, "--resync-seconds (env SLIME_RESYNC_SECONDS)", "greater than 0"),
    (
        "scaling",
        ["--patch-timeout-seconds", "-1"],
        {},
        "--patch-timeout-seconds (env SLIME_PATCH_TIMEOUT_SECONDS)",
        "greater than 0",
    ),
    ("scaling", ["--config-map", ""], {}, "--config-map (env SLIME_CONFIG_MAP)", "is not a valid object name"),
]


@pytest.mark.parametrize(
    ("service", "argv", "env", "field", "reason"), CASES, ids=[f"{c[0]}:{' '.join(c[1]) or c[2]}" for c in CASES]
)
def test_bad_configuration_exits_2_with_one_line(
    service: str,
    argv: list[str],
    env: dict[str, str],
    field: str,
    reason: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    main = injection_main if service == "injection" else scaling_main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{service}-webhook: invalid configuration: {field}"), err
    assert reason in err


def _not_pem(directory: Path) -> str:
    path = directory / "not-pem.crt"
    path.write_text("-----BEGIN NOTHING-----\n")
    return str(path)


CERTIFICATE_CASES = [
    # (argv builder, the field named, the reason)
    (
        lambda d, pki: ["--cert-file", str(d / "missing.crt")],
        "--cert-file (env SLIME_CERT_FILE)",
        "cannot read {d}/missing.crt: No such file or directory",
    ),
    (lambda d, pki: ["--cert-file", str(d)], "--cert-file (env SLIME_CERT_FILE)", "cannot read {d}: Is a directory"),
    (lambda d, pki: ["--cert-file", _not_pem(d)], "--cert-file (env SLIME_CERT_FILE)", "{d}/not-pem.crt holds no PEM"),
    (
        lambda d, pki: ["--key-file", str(d / "missing.key")],
        "--key-file (env SLIME_KEY_FILE)",
        "cannot read {d}/missing.key: No such file or directory",
    ),
    (
        lambda d, pki: ["--key-file", str(pki.cert_file)],
        "--key-file (env SLIME_KEY_FILE)",
        "holds no unencrypted PEM private key",
    ),
    (
        lambda d, pki: ["--key-file", str(make_pki(d / "other").key_file)],
        "--key-file (env SLIME_KEY_FILE)",
        "{d}/other/tls.key is not the key of the certificate in",
    ),
    (
        lambda d, pki: ["--client-ca-file", str(d / "ca.crt")],
        "--client-ca-file (env SLIME_CLIENT_CA_FILE)",
        "cannot read {d}/ca.crt: No such file or directory",
    ),
]


@pytest.mark.parametrize(("argv", "field", "reason"), CERTIFICATE_CASES)
@pytest.mark.parametrize("service", ["injection", "scaling"])
def test_an_unusable_certificate_file_exits_2_naming_its_flag(
    service: str,
    argv: Any,
    field: str,
    reason: str,
    serving: Pki,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    main = injection_main if service == "injection" else scaling_main
    with pytest.raises(SystemExit) as exit_:
        main([*argv(tmp_path, serving), "--kubeconfig", _kubeconfig_text(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{service}-webhook: invalid configuration: {field}: "), err
    assert reason.format(d=tmp_path) in err, err


@pytest.mark.parametrize("service", ["injection", "scaling"])
def test_a_port_in_use_exits_2_naming_the_port(
    service: str, busy_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = injection_main if service == "injection" else scaling_main
    with pytest.raises(SystemExit) as exit_:
        main(["--host", "127.0.0.1", "--metrics-port", str(busy_port), "--kubeconfig", _kubeconfig_text(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"{service}-webhook: invalid configuration: --metrics-port (env SLIME_METRICS_PORT): "
        f"cannot listen on 127.0.0.1:{busy_port}: Address already in use"
    ), err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--kubeconfig", "/etc/hostname", "--host", "127.0.0.1"],
            "injection-webhook: invalid configuration: --kubeconfig (env KUBECONFIG): kubeconfig /etc/hostname is not "
            "usable: /etc/hostname is not a kubeconfig (its YAML is not a map)\n",
        ),
        (
            ["--host", "999.1.1.1"],
            "injection-webhook: invalid configuration: --host (env SLIME_HOST): '999.1.1.1' is not an IP address\n",
        ),
        (
            ["--cert-file", "/nonexistent/tls.crt"],
            "injection-webhook: invalid configuration: --cert-file (env SLIME_CERT_FILE): cannot read "
            "/nonexistent/tls.crt: No such file or directory\n",
        ),
    ],
)
def test_the_process_prints_only_that_line(argv: list[str], expected: str, serving: Pki) -> None:
    ports = ["--port", str(free_port()), "--metrics-port", str(free_port())]
    result = subprocess.run(
        [sys.executable, "-m", "injection_webhook.main", *argv, *ports],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "SLIME_CERT_FILE": str(serving.cert_file),
            "SLIME_KEY_FILE": str(serving.key_file),
        },
    )
    assert (result.returncode, result.stderr, result.stdout) == (2, expected, "")


def test_help_names_every_environment_twin_and_readable_types(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        scaling_main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for env in (
        "SLIME_PORT",
        "SLIME_METRICS_PORT",
        "SLIME_HOST",
        "SLIME_CERT_FILE",
        "SLIME_KEY_FILE",
        "SLIME_CLIENT_CA_FILE",
        "SLIME_CERT_POLL_SECONDS",
        "SLIME_MAX_BODY_BYTES",
        "SLIME_SHUTDOWN_DELAY_SECONDS",
        "SLIME_LOG_LEVEL",
        "KUBECONFIG",
        "SLIME_CONFIG_MAP",
        "POD_NAMESPACE",
        "SLIME_RESYNC_SECONDS",
        "SLIME_PATCH_TIMEOUT_SECONDS",
    ):
        assert f"[env {env};" in text, env
    assert "--port PORT" in text and "--resync-seconds SECONDS" in text and "--kubeconfig FILE" in text
    assert "{str,null}" not in text and " str " not in text
