"""Flags and environment of ``scaling-webhook`` (docs/interfaces.md)."""

from __future__ import annotations

import pytest

from common.cli import parse_settings
from scaling_webhook.settings import ScalingSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "POD_NAMESPACE",
        "NAMESPACE",
        "SLIME_CONFIG_MAP",
        "SLIME_RESYNC_SECONDS",
        "SLIME_PATCH_TIMEOUT_SECONDS",
        "KUBECONFIG",
    ):
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    settings = parse_settings(ScalingSettings, [], "scaling-webhook")
    assert (settings.config_map, settings.namespace, settings.resync_seconds, settings.patch_timeout_seconds) == (
        "scaling-webhook-configmap",
        "default",
        30,
        2,
    )
    # Not the injection webhook's 8443/8080: both services run side by side on one machine.
    assert (settings.port, settings.metrics_port) == (8444, 8081)


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "slime")
    monkeypatch.setenv("SLIME_CONFIG_MAP", "cm")
    monkeypatch.setenv("SLIME_RESYNC_SECONDS", "5")
    monkeypatch.setenv("SLIME_PATCH_TIMEOUT_SECONDS", "0.5")
    settings = parse_settings(ScalingSettings, [], "scaling-webhook")
    assert (settings.namespace, settings.config_map, settings.resync_seconds, settings.patch_timeout_seconds) == (
        "slime",
        "cm",
        5,
        0.5,
    )


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "slime")
    monkeypatch.setenv("SLIME_CONFIG_MAP", "cm")
    settings = parse_settings(
        ScalingSettings,
        [
            "--namespace",
            "ops",
            "--config-map",
            "other",
            "--resync-seconds",
            "7",
            "--patch-timeout-seconds",
            "1.5",
            "--port",
            "9443",
            "--metrics-port",
            "9080",
            "--cert-file",
            "/c",
            "--key-file",
            "/k",
        ],
        "scaling-webhook",
    )
    assert (settings.namespace, settings.config_map, settings.resync_seconds, settings.patch_timeout_seconds) == (
        "ops",
        "other",
        7,
        1.5,
    )
    assert (settings.port, settings.metrics_port, settings.cert_file, settings.key_file) == (9443, 9080, "/c", "/k")


def test_a_plain_namespace_variable_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESPACE", "elsewhere")
    assert parse_settings(ScalingSettings, [], "scaling-webhook").namespace == "default"
