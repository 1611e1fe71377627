"""slime-check's release line: the build each webhook's pods run, read from their /version through the pod proxy."""

from __future__ import annotations

from typing import Any

from common.kube import KubeError
from common.version import version
from injection_webhook.settings import InjectionSettings
from preflight.install import Component
from preflight.version import running

DEPLOYMENT = {
    "metadata": {"name": "slime-injection-webhook", "namespace": "slime-system"},
    "spec": {"selector": {"matchLabels": {"app.kubernetes.io/component": "injection-webhook"}}},
}


class Cluster:
    """Answers the two calls the line makes: the pods, and each pod's /version through the proxy."""

    def __init__(self, pods: dict[str, Any]) -> None:
        self.pods = pods  # name -> the /version answer, or a KubeError to raise
        self.paths: list[str] = []

    def request(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        self.paths.append(path)
        if path.endswith("/pods"):
            assert options["query"] == [("labelSelector", "app.kubernetes.io/component=injection-webhook")]
            items = [{"metadata": {"name": n}, "status": {"phase": "Running"}} for n in self.pods]
            return {"items": [*items, {"metadata": {"name": "gone"}, "status": {"phase": "Succeeded"}}]}
        name = path.split("/pods/")[1].split(":")[0]
        answer = self.pods[name]
        if isinstance(answer, KubeError):
            raise answer
        return dict(answer)


def component() -> Component:
    return Component("injection", DEPLOYMENT, InjectionSettings(metrics_port=9090))


def test_one_build_on_every_pod() -> None:
    mine = {"version": version(), "revision": "abc123"}
    cluster = Cluster({"p1": mine, "p2": mine})
    text, consistent = running(cluster, component(), 5)  # type: ignore[arg-type]
    assert (text, consistent) == (f"running {version()} (revision abc123) on 2 pod(s)", True)
    assert "/api/v1/namespaces/slime-system/pods/p1:9090/proxy/version" in cluster.paths  # the metrics port


def test_a_rollout_half_done_is_not_consistent_and_names_slime_checks_own_version() -> None:
    cluster = Cluster({"p1": {"version": "0.1.0", "revision": "old"}, "p2": {"version": version(), "revision": "new"}})
    text, consistent = running(cluster, component(), 5)  # type: ignore[arg-type]
    assert not consistent
    assert text == (
        f"running 0.1.0 (revision old) on 1 pod(s); {version()} (revision new) on 1 pod(s); "
        f"this slime-check is {version()}"
    )


def test_what_could_not_be_read_is_said() -> None:
    refused = KubeError(503, "ServiceUnavailable", "error trying to reach service: address not allowed")
    cluster = Cluster({"p1": refused})
    text, consistent = running(cluster, component(), 5)  # type: ignore[arg-type]
    assert (
        consistent and text == "version not read (not read from p1: error trying to reach service: address not allowed)"
    )
    assert running(Cluster({}), component(), 5) == ("version not read: no Running pod", True)  # type: ignore[arg-type]
