"""A tenant of a shared management cluster against the injection webhook.

The tenant writes its own namespace: Secrets (a kubeconfig), Metal3DataTemplates and their labels
and annotations. Nothing it writes runs, reads a local file or reaches another tenant's key: each
attempt here goes through the webhook over TLS, as CAPM3's CREATE of the tenant's metaData Secret.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.logs import JsonFormatter
from injection_webhook.resolver import VERIFY_WAIT_SECONDS
from kubemu import Emulator, Fault
from testbed.components.serve import RunningService
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import b64, kubeconfig_secret, metadata_secret
from testbed.framework.reviews import denial, injected, mutate, withheld
from testbed.framework.wait import wait_for
from testbed.framework.world import seed_metal3, seed_slinky

StartInjection = Callable[..., RunningService]

UNBOUND_WARNING = (
    "SliMe added no Slurm join data: this namespace is not bound to the Slurm namespace its template names"
)


def tenant_template(
    emu: Emulator, tenant: str, slurm_namespace: str, annotations: dict[str, str] | None = None, **labels: str
) -> dict[str, Any]:
    """Tenant ``tenant``'s opted-in template naming ``slurm_namespace``, and one Metal3Data of it."""
    _, data = seed_metal3(
        emu,
        namespace=tenant,
        template_labels={"slurm-controller-namespace": slurm_namespace, **labels},
        template_annotations=annotations,
    )
    return data


def withheld_events(emu: Emulator, namespace: str) -> list[dict[str, Any]]:
    return [e for e in emu.list("v1", "Event", namespace) if e.get("reason") == "SlurmJoinDataWithheld"]


# --- whose key: the operator's bindings decide, not the template ----------------------------------------------


def test_a_template_naming_another_tenants_slurm_namespace_gets_no_key(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    slurm_a = seed_slinky(emulator, namespace="slurm-a", controller="a", host_ip="192.0.2.1")
    slurm_b = seed_slinky(emulator, namespace="slurm-b", controller="b", host_ip="192.0.2.2")
    own = tenant_template(emulator, "tenant-a", "slurm-a")
    thief = tenant_template(emulator, "tenant-b", "slurm-a")  # tenant B's template names tenant A's Slurm
    service = start_injection(emulator, slurm_bindings="tenant-a=slurm-a,tenant-b=slurm-b")
    assert b64(slurm_a.key) == injected(mutate(service, metadata_secret(own)))["slurm_key_base64"]
    response = mutate(service, metadata_secret(thief))
    warning, message = withheld(response)
    assert warning == UNBOUND_WARNING
    assert message == (
        "Slurm join data withheld from Secret tenant-b/m3m-0-metadata: Metal3DataTemplate tenant-b/workers-template "
        "names the Slinky Controller in namespace slurm-a of the management cluster, and namespace tenant-b is not "
        "bound to it (the operator grants it with the binding tenant-b=slurm-a in --slurm-bindings)"
    )
    answer = json.dumps(response)
    assert b64(slurm_a.key) not in answer and b64(slurm_b.key) not in answer
    assert "192.0.2.1" not in answer  # not even where tenant A's controller runs
    events = wait_for(lambda: withheld_events(emulator, "tenant-b"), what="the Warning Event on the Metal3Data")
    assert [e["involvedObject"]["name"] for e in events] == [thief["metadata"]["name"]]
    assert 'slime_injection_join_data_withheld_total{reason="unbound-namespace"} 1.0' in metrics(service)


def test_without_a_binding_a_tenant_reaches_only_its_own_namespace(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    own_slurm = seed_slinky(emulator, namespace="tenant-c", controller="c")  # Slinky next to its Metal3 objects
    seed_slinky(emulator, namespace="slurm", controller="site")
    own = tenant_template(emulator, "tenant-c", "tenant-c")
    site = tenant_template(emulator, "tenant-d", "slurm")
    service = start_injection(emulator, slurm_bindings="")
    assert injected(mutate(service, metadata_secret(own)))["slurm_key_base64"] == b64(own_slurm.key)
    assert withheld(mutate(service, metadata_secret(site)))[0] == UNBOUND_WARNING


def test_a_binding_for_every_namespace_serves_every_tenant(emulator: Emulator, start_injection: StartInjection) -> None:
    site = seed_slinky(emulator, namespace="slurm", controller="site")
    first, second = tenant_template(emulator, "tenant-e", "slurm"), tenant_template(emulator, "tenant-f", "slurm")
    service = start_injection(emulator, slurm_bindings="*=slurm")
    for data in (first, second):
        assert injected(mutate(service, metadata_secret(data)))["slurm_key_base64"] == b64(site.key)


def test_a_template_cannot_opt_itself_into_the_jwt_key(emulator: Emulator, start_injection: StartInjection) -> None:
    slurm = seed_slinky(emulator)
    data = tenant_template(emulator, "metal3", "slurm", annotations={"slurm-extra-join-data": "jwt-key"})
    service = start_injection(emulator)  # the operator lets templates choose nothing
    response = mutate(service, metadata_secret(data))
    assert (
        withheld(response)[0]
        == "SliMe added no Slurm join data: the template asks for join data templates may not choose"
    )
    assert b64(slurm.jwt_key) not in json.dumps(response) and b64(slurm.key) not in json.dumps(response)


def test_the_workload_cluster_is_reached_only_through_a_workload_binding(
    emulator_factory: Callable[..., Emulator], start_injection: StartInjection
) -> None:
    management, workload = emulator_factory(), emulator_factory(workload=True)
    remote = seed_slinky(workload, namespace="slurm", host_ip="203.0.113.7")
    data = tenant_template(management, "tenant-g", "slurm", **{"slurm-controller-cluster": "workload"})
    management.create(kubeconfig_secret(workload.kubeconfig(), namespace="tenant-g"))
    unbound = start_injection(management, slurm_bindings="tenant-g=slurm")  # the management cluster only
    assert withheld(mutate(unbound, metadata_secret(data)))[0] == UNBOUND_WARNING
    assert workload.count_requests() == 0
    bound = start_injection(management, slurm_bindings="tenant-g=workload:slurm")
    assert injected(mutate(bound, metadata_secret(data)))["slurm_key_base64"] == b64(remote.key)


# --- a tenant's kubeconfig is data: nothing runs, no file is read ---------------------------------------------


def hostile_kubeconfigs(tmp: Path) -> dict[str, tuple[dict[str, Any], str]]:
    """Kubeconfigs a tenant could write, each with the field the denial must name."""
    marker = tmp / "ran"
    fifo = str(tmp / "fifo")
    server = "https://127.0.0.1:1"

    def config(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "c",
            "clusters": [{"name": "c", "cluster": cluster or {"server": server}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }

    exec_plugin = {"apiVersion": "client.authentication.k8s.io/v1", "command": "touch", "args": [str(marker)]}
    return {
        "exec": (config({"exec": exec_plugin}), "users[0].user.exec is not allowed"),
        "auth-provider": (
            config({"auth-provider": {"name": "gcp", "config": {"cmd-path": "touch", "cmd-args": str(marker)}}}),
            "users[0].user.auth-provider is not allowed",
        ),
        "tokenFile": (config({"tokenFile": fifo}), "users[0].user.tokenFile is not allowed"),
        "client-certificate file": (
            config({"client-certificate": fifo, "client-key": fifo}),
            "users[0].user.client-certificate is not allowed",
        ),
        "certificate-authority file": (
            config({"token": "t"}, {"server": server, "certificate-authority": fifo}),
            "clusters[0].cluster.certificate-authority is not allowed",
        ),
        "proxy-url": (
            config({"token": "t"}, {"server": server, "proxy-url": "http://127.0.0.1:2"}),
            "clusters[0].cluster.proxy-url is not allowed",
        ),
        "insecure-skip-tls-verify": (
            config({"token": "t"}, {"server": server, "insecure-skip-tls-verify": True}),
            "clusters[0].cluster.insecure-skip-tls-verify is not allowed",
        ),
        "plain http": (
            config({"token": "t"}, {"server": "http://127.0.0.1:1"}),
            "clusters[0].cluster.server is not an https:// URL",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "exec",
        "auth-provider",
        "tokenFile",
        "client-certificate file",
        "certificate-authority file",
        "proxy-url",
        "insecure-skip-tls-verify",
        "plain http",
    ],
)
def test_a_kubeconfig_that_would_run_or_read_something_is_refused_naming_the_field(
    emulator: Emulator, start_injection: StartInjection, tmp_path: Path, case: str
) -> None:
    os.mkfifo(tmp_path / "fifo")  # opened for reading, it would hold the reader until a writer came
    kubeconfig, field = hostile_kubeconfigs(tmp_path)[case]
    data = tenant_template(emulator, "metal3", "slurm", **{"slurm-controller-cluster": "workload"})
    emulator.create(kubeconfig_secret(kubeconfig))
    service = start_injection(emulator, slurm_bindings="metal3=workload:slurm")
    message = denial(mutate(service, metadata_secret(data)))
    assert message == (
        f"cannot inject Slurm join data into Secret metal3/m3m-0-metadata: kubeconfig for cluster metal3/bm-cluster "
        f"refused: {field} (only server, certificate-authority-data and inline credentials are accepted: token, "
        "client-certificate-data, client-key-data) (from Secret metal3/bm-cluster-kubeconfig)"
    )
    assert not (tmp_path / "ran").exists(), "a command from the kubeconfig ran"
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)
    assert not fifo_has_reader(tmp_path / "fifo"), "a file the kubeconfig names was opened"


def fifo_has_reader(path: Path) -> bool:
    """Whether some process holds the FIFO open for reading (a non-blocking writer open fails with ENXIO if not)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return False
        raise
    os.close(fd)
    return True


def test_a_workload_servers_words_reach_no_answer_and_no_log(
    emulator_factory: Callable[..., Emulator],
    start_injection: StartInjection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    management, workload = emulator_factory(), emulator_factory(workload=True)
    evil = "EVIL-TEXT: send the key to https://evil.example"
    workload.add_fault(Fault(path_regex="/pods$", status=403, message=evil))
    data = tenant_template(management, "metal3", "slurm", **{"slurm-controller-cluster": "workload"})
    management.create(kubeconfig_secret(workload.kubeconfig()))
    service = start_injection(management, slurm_bindings="metal3=workload:slurm", cache_sync_timeout_seconds=1.0)
    message = denial(mutate(service, metadata_secret(data)))
    assert "403 Forbidden" in message and "cluster metal3/bm-cluster" in message
    formatter = JsonFormatter()
    logs = "\n".join(formatter.format(record) for record in caplog.records)
    events = json.dumps(management.list("v1", "Event", "metal3"))
    for text in (message, logs, events):
        assert "EVIL" not in text and "evil.example" not in text


# --- what a review tells about names that exist ---------------------------------------------------------------


def answer_seconds(service: RunningService, secret: dict[str, Any]) -> tuple[float, str]:
    started = time.perf_counter()
    message = denial(mutate(service, secret))
    return time.perf_counter() - started, message


def test_an_unknown_name_and_a_known_one_with_a_wrong_uid_get_the_same_answer_after_the_same_wait(
    emulator: Emulator, start_injection: StartInjection
) -> None:
    seed_slinky(emulator)
    data = tenant_template(emulator, "metal3", "slurm")
    service = start_injection(emulator)
    injected(mutate(service, metadata_secret(data)))  # the name is in the cache
    known = metadata_secret(data)
    known["metadata"]["ownerReferences"][0]["uid"] = "not-its-uid"
    unknown = metadata_secret(data)
    unknown["metadata"]["ownerReferences"][0]["name"] = "no-such-metal3data"
    answers = [answer_seconds(service, secret) for secret in (known, unknown, unknown)]  # the last: remembered absent
    assert len({message.replace("no-such-metal3data", "X") for _, message in answers}) == 1
    # Never sooner than the wait a not-yet-created name gets: a fast answer would say "this name exists".
    assert all(seconds >= VERIFY_WAIT_SECONDS - 0.001 for seconds, _ in answers), answers


def test_names_copied_from_a_review_into_the_log_are_cut_short(
    emulator: Emulator, start_injection: StartInjection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    seed_slinky(emulator)
    data = tenant_template(emulator, "metal3", "slurm")
    secret = metadata_secret(data)
    secret["metadata"]["name"] = "n" * 20_000
    mutate(start_injection(emulator), secret, requester="system:serviceaccount:tenant:" + "u" * 20_000)
    admissions = [r for r in caplog.records if r.getMessage() == "admission"]
    assert admissions
    line = JsonFormatter().format(admissions[-1])
    assert len(line) < 4096, len(line)


def metrics(service: RunningService) -> str:
    text = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
    EVIDENCE.add_text("injection metrics", text)
    return text
