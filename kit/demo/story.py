"""The demo's story on the emulated cluster: its narrator and its three acts.

(1) CAPM3 creates a worker's metaData Secret and the injection webhook adds the Slurm join data;
(2) KEDA scales the mirror 0 -> 3 -> 1 and the MachineDeployment follows; (3) drift (a direct
edit, and a scale while the mapping is removed) is healed by the reconciler. Each act raises
:class:`~demo.environment.DemoError` when an expectation does not hold.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from demo import cluster
from demo.chart import chart_dir
from demo.environment import BUSY_MACHINE_SECONDS, INJECTION_WEBHOOK, SCALING_WEBHOOK, DemoEnvironment, DemoError
from testbed.framework.helm import helm_binary
from testbed.framework.wait import WaitTimeout, wait_for
from testbed.framework.world import impersonating

INJECTED_KEYS = ("slurm_controller_host", "slurm_controller_port", "slurm_conf_server", "slurm_key_base64")
CAPI_GROUP, CAPI_VERSION = cluster.CAPI_VERSION.split("/")


class Narrator:
    """Prints the narrative and keeps it, so the demo can prove the key never appeared."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self._out = out
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        self.lines.append(text)
        self._out(text)

    def section(self, title: str) -> None:
        self("")
        self(title)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _api_error(exc: ApiException) -> str:
    try:
        return json.loads(exc.body or "").get("message") or str(exc.reason)
    except (ValueError, TypeError, AttributeError):
        return f"HTTP {exc.status} {exc.reason}"


class Story:
    def __init__(self, env: DemoEnvironment, say: Narrator) -> None:
        self.env = env
        self.say = say
        api = env.api_client()
        self.api = api
        self.core = k8s.CoreV1Api(api)
        # CAPM3 creates the metaData Secrets as its own ServiceAccount; only that identity gets join data.
        self.capm3 = k8s.CoreV1Api(impersonating(env.api_client()))
        self.tenant = k8s.CoreV1Api(impersonating(env.api_client(), "tenant-ci-robot"))
        self.apps = k8s.AppsV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)

    # --- helpers ------------------------------------------------------------------------------

    def calls_since(self, start: int, webhook: str | None = None) -> list[Any]:
        assert self.env.chain is not None
        return [c for c in self.env.chain.calls[start:] if webhook is None or c.webhook == webhook]

    def mark(self) -> int:
        assert self.env.chain is not None
        return len(self.env.chain.calls)

    def md_replicas(self) -> int | None:
        md: Any = self.custom.get_namespaced_custom_object(
            CAPI_GROUP, CAPI_VERSION, cluster.METAL3_NAMESPACE, "machinedeployments", cluster.MACHINE_DEPLOYMENT
        )
        return (md.get("spec") or {}).get("replicas")

    def _md_at(self, replicas: int) -> Callable[[], bool]:
        return lambda: self.md_replicas() == replicas

    def mirror_replicas(self) -> int:
        scale = self.apps.read_namespaced_deployment_scale(cluster.MIRROR, cluster.SLIME_NAMESPACE)
        return int(scale.spec.replicas) if scale.spec is not None and scale.spec.replicas is not None else 0

    def keda_scale(self, replicas: int) -> None:
        """What KEDA's HPA does: PATCH the mirror's /scale subresource."""
        try:
            self.apps.patch_namespaced_deployment_scale(
                cluster.MIRROR, cluster.SLIME_NAMESPACE, {"spec": {"replicas": replicas}}
            )
        except ApiException as exc:
            raise DemoError(f"scaling the mirror to {replicas} was rejected: {_api_error(exc)}") from None

    def set_mapping(self, text: str) -> None:
        try:
            self.core.patch_namespaced_config_map(
                "scaling-webhook-configmap", cluster.SLIME_NAMESPACE, {"data": {"mappings": text}}
            )
        except ApiException as exc:
            raise DemoError(f"cannot update the scaling ConfigMap: {_api_error(exc)}") from None

    def describe_call(self, start: int, webhook: str) -> str:
        calls = self.calls_since(start, webhook)
        if not calls:
            return f"{webhook} was not called"
        call = calls[-1]
        text = f"{webhook} {call.outcome} in {call.seconds * 1000:.0f} ms"
        return f"{text}: {call.message}" if call.message else text

    # --- the acts -------------------------------------------------------------------------------

    def setup_summary(self) -> None:
        env, say = self.env, self.say
        assert env.emulator and env.injection and env.scaling and env.chain and env.seeded
        say(f"  chart     {chart_dir()} rendered with `helm template` ({helm_binary()})")
        for hook in env.chain.webhooks:
            kind = "mutating" if hook.mutating else "validating"
            rules = ", ".join(
                f"{'/'.join(r.get('apiGroups') or ['']) or 'core'} {','.join(r['resources'])} "
                f"{','.join(r['operations'])}"
                for r in hook.spec.get("rules") or []
            )
            say(
                f"            {kind} {hook.name}: {rules}; failurePolicy {hook.failure_policy}, "
                f"timeout {hook.timeout_seconds:g} s, {len(hook.spec.get('matchConditions') or [])} matchConditions"
            )
        say(f"  cluster   kubemu at {env.emulator.url}")
        say(
            f"            Slinky Controller {cluster.SLURM_NAMESPACE}/{cluster.CONTROLLER}; slurmctld pod on hostIP "
            f"{cluster.HOST_IP}, NodePort {cluster.NODE_PORT}; key Secret "
            f"{cluster.SLURM_NAMESPACE}/{env.seeded.key_secret}"
        )
        say(
            f"            Metal3DataTemplate {cluster.METAL3_NAMESPACE}/{cluster.TEMPLATE} "
            f"(slurm-controller-namespace={cluster.SLURM_NAMESPACE}), Metal3Data "
            f"{cluster.METAL3_NAMESPACE}/{cluster.TEMPLATE}-0"
        )
        say(
            f"            MachineDeployment {cluster.METAL3_NAMESPACE}/{cluster.MACHINE_DEPLOYMENT} "
            f"({CAPI_GROUP}/{CAPI_VERSION}), mirror Deployment {cluster.SLIME_NAMESPACE}/{cluster.MIRROR}, ConfigMap "
            f"{cluster.SLIME_NAMESPACE}/scaling-webhook-configmap"
        )
        say(
            f"  webhooks  injection-webhook {env.injection.url}/mutate, scaling-webhook {env.scaling.url}/validate "
            "(TLS; the chain trusts only the demo CA)"
        )
        say(
            f"            the operator binds namespace {cluster.METAL3_NAMESPACE} to the Slurm namespace "
            f"{cluster.SLURM_NAMESPACE} (--slurm-bindings {cluster.SLURM_BINDINGS}); templates may opt into "
            f"{cluster.TEMPLATE_OPT_INS} (--template-opt-ins)"
        )

    def act_injection(self) -> None:
        say, env = self.say, self.env
        assert env.seeded is not None and env.emulator is not None
        say.section("1. A bare-metal worker gets its Slurm join data")
        secret = cluster.metadata_secret(env.seeded.metal3_data)
        name, ns = secret["metadata"]["name"], secret["metadata"]["namespace"]
        sent = yaml.safe_load(base64.b64decode(secret["data"]["metaData"]))
        say(
            f"  CAPM3 creates Secret {ns}/{name} (owned by Metal3Data "
            f"{ns}/{env.seeded.metal3_data['metadata']['name']}) with metaData keys {', '.join(sent)}"
        )
        start = self.mark()
        try:
            self.capm3.create_namespaced_secret(ns, cast(Any, secret))  # the client sends dicts as they are
        except ApiException as exc:
            raise DemoError(f"the metaData Secret was rejected: {_api_error(exc)}") from None
        say(f"  admission: {self.describe_call(start, INJECTION_WEBHOOK)}")
        stored = self.core.read_namespaced_secret(name, ns)
        meta = yaml.safe_load(base64.b64decode((stored.data or {})["metaData"]))
        missing = [k for k in INJECTED_KEYS if k not in meta]
        if missing:
            raise DemoError(f"the stored Secret lacks the injected key(s) {', '.join(missing)}")
        for key, value in sent.items():
            if meta.get(key) != value:
                raise DemoError(f"the stored Secret changed the existing key {key!r}")
        self._show_metadata(meta, sent)
        self._check_join_data(meta)
        self._tenant_dry_run(ns)
        self._match_conditions(ns)

    def _show_metadata(self, meta: dict[str, Any], sent: dict[str, Any]) -> None:
        say = self.say
        say("  stored metaData:")
        width = max(len(k) for k in meta) + 1
        for key, value in meta.items():
            shown = self._redacted(str(value)) if key == "slurm_key_base64" else str(value)
            mark = "   (added)" if key not in sent else ""
            say(f"    {key + ':':<{width}} {shown}{mark}")

    def _check_join_data(self, meta: dict[str, Any]) -> None:
        seeded = self.env.seeded
        assert seeded is not None
        expected = {
            "slurm_controller_host": cluster.HOST_IP,
            "slurm_controller_port": str(cluster.NODE_PORT),
            "slurm_conf_server": f"{cluster.HOST_IP}:{cluster.NODE_PORT}",
            "slurm_controller_name": f"{cluster.CONTROLLER}-controller-0",
        }
        for key, value in expected.items():
            if str(meta.get(key)) != value:
                raise DemoError(f"{key} is {meta[key]!r}, expected {value!r}")
        try:
            decoded = base64.b64decode(str(meta["slurm_key_base64"]), validate=True)
        except ValueError:
            raise DemoError("slurm_key_base64 is not valid base64") from None
        if decoded != seeded.slurm_key:
            raise DemoError(
                f"slurm_key_base64 does not decode to slurm.key of {cluster.SLURM_NAMESPACE}/{seeded.key_secret}"
            )
        self.say(
            f"  slurm_key_base64 decodes to the {len(decoded)} bytes of slurm.key in "
            f"{cluster.SLURM_NAMESPACE}/{seeded.key_secret}; cloud-init can now run "
            f"`slurmd -Z --conf-server {meta['slurm_conf_server']}`"
        )

    def _tenant_dry_run(self, ns: str) -> None:
        """A tenant who may create Secrets asks the API server for a dry run of the same Secret: the answer would
        carry the key if the webhook added it to dry runs or to other requesters."""
        assert self.env.seeded is not None
        probe = cluster.metadata_secret(self.env.seeded.metal3_data, machine="probe-0")
        try:
            answer = self.tenant.create_namespaced_secret(ns, cast(Any, probe), dry_run="All")
        except ApiException as exc:
            raise DemoError(f"the tenant's dry run was rejected: {_api_error(exc)}") from None
        probed = yaml.safe_load(base64.b64decode((answer.data or {})["metaData"]))
        if "slurm_key_base64" in probed:
            raise DemoError("a tenant's server-side dry run received slurm.key")
        self.say(
            "  A tenant's `kubectl create --dry-run=server` of the same Secret (user tenant-ci-robot): admitted "
            "without join data, with a warning; only CAPM3's identity on a stored create gets the key."
        )

    def _match_conditions(self, ns: str) -> None:
        """The matchConditions (CEL) keep other Secrets away from the webhook."""
        start = self.mark()
        plain = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "bmc-credentials", "namespace": ns},
            "data": {"username": cluster.b64("admin")},
        }
        self.core.create_namespaced_secret(ns, cast(Any, plain))
        if self.calls_since(start, INJECTION_WEBHOOK):
            raise DemoError("a Secret not owned by a Metal3Data reached the injection webhook")
        self.say(
            f"  An ordinary Secret ({ns}/bmc-credentials) is stored as sent: the chart's matchConditions "
            "(CEL) keep it away from the webhook."
        )

    @staticmethod
    def _redacted(value: str) -> str:
        digest = hashlib.sha256(value.encode()).hexdigest()[:12]
        return f"<redacted: {len(value)} base64 characters, sha256 {digest}...>"

    def act_scaling(self) -> None:
        say = self.say
        say.section("2. KEDA scales the mirror; the MachineDeployment follows")
        md_ref = f"MachineDeployment {cluster.METAL3_NAMESPACE}/{cluster.MACHINE_DEPLOYMENT}"
        say(
            f"  now: mirror {cluster.SLIME_NAMESPACE}/{cluster.MIRROR} = {self.mirror_replicas()}, {md_ref} = "
            f"{self.md_replicas()}"
        )
        if self.md_replicas() != 0:
            raise DemoError(f"{md_ref} should start at 0, it is {self.md_replicas()}")
        for replicas in (3, 1):
            start = self.mark()
            self.keda_scale(replicas)
            say(f"  KEDA: PATCH deployments/{cluster.MIRROR}/scale to {replicas}")
            say(f"    admission: {self.describe_call(start, SCALING_WEBHOOK)}")
            wait_for(self._md_at(replicas), BUSY_MACHINE_SECONDS, f"{md_ref} to reach {replicas}")
            say(f"    {md_ref} spec.replicas = {self.md_replicas()}")
        say("  MachineDeployment replicas: 0 -> 3 -> 1, following the mirror.")

    def act_healing(self) -> None:
        say, env = self.say, self.env
        assert env.scaling_service is not None
        md_ref = f"MachineDeployment {cluster.METAL3_NAMESPACE}/{cluster.MACHINE_DEPLOYMENT}"
        say.section(f"3. Drift is healed (the reconciler runs every {env.resync_seconds:g} s and on mapping changes)")

        mirror = self.mirror_replicas()
        say(f"  a) Someone scales {md_ref} to 5 by hand (not through the mirror, which says {mirror}).")
        try:
            scaled: Any = self.custom.patch_namespaced_custom_object_scale(
                CAPI_GROUP,
                CAPI_VERSION,
                cluster.METAL3_NAMESPACE,
                "machinedeployments",
                cluster.MACHINE_DEPLOYMENT,
                {"spec": {"replicas": 5}},
            )
        except ApiException as exc:
            raise DemoError(f"cannot scale the MachineDeployment by hand: {_api_error(exc)}") from None
        # The API server's answer is the stored Scale: the drift is in. (Polling for it instead could
        # miss it: the reconciler may heal it before a busy machine gets round to looking.)
        if (scaled.get("spec") or {}).get("replicas") != 5:
            raise DemoError(f"the API server did not store the drift: {md_ref}/scale answered {scaled.get('spec')}")
        started = time.monotonic()
        wait_for(
            lambda: self.md_replicas() == mirror,
            BUSY_MACHINE_SECONDS,
            f"the reconciler to heal {md_ref} back to {mirror}",
        )
        say(f"     healed: {md_ref} = {self.md_replicas()} after {time.monotonic() - started:.1f} s")
        self._show_event("DriftCorrected", contains="(was 5)")

        configmap = self.core.read_namespaced_config_map("scaling-webhook-configmap", cluster.SLIME_NAMESPACE)
        original = (configmap.data or {})["mappings"]
        say("  b) The mapping is removed from ConfigMap scaling-webhook-configmap for a moment.")
        self.set_mapping("[]\n")
        source = env.scaling_service.source
        wait_for(lambda: len(source.table) == 0, BUSY_MACHINE_SECONDS, "the scaling webhook to drop the mapping")
        start = self.mark()
        self.keda_scale(2)
        say(f"     KEDA scales the mirror to 2; admission: {self.describe_call(start, SCALING_WEBHOOK)}")
        stuck = self.md_replicas()
        if stuck != mirror:
            raise DemoError(f"with no mapping, {md_ref} should have stayed at {mirror}, it is {stuck}")
        say(f"     no mapping, so nothing follows: {md_ref} stays at {stuck} while the mirror says 2")
        self.set_mapping(original)
        wait_for(
            lambda: self.mirror_replicas() == stuck,
            BUSY_MACHINE_SECONDS,
            f"the mirror to be adopted at {md_ref}'s {stuck}",
        )
        if self.md_replicas() != stuck:
            raise DemoError(f"mapping again must never move the pool: {md_ref} is {self.md_replicas()}, was {stuck}")
        say(
            f"     the mapping is restored: the mirror is adopted at the MachineDeployment's {stuck} "
            "(a new mapping never moves a pool)"
        )
        self._show_event("AdoptedByMirror", contains=f"this MachineDeployment's {stuck} replicas")
        started = time.monotonic()
        start = self.mark()
        self.keda_scale(2)
        say(f"     KEDA scales the mirror to 2 again; admission: {self.describe_call(start, SCALING_WEBHOOK)}")
        wait_for(lambda: self.md_replicas() == 2, BUSY_MACHINE_SECONDS, f"{md_ref} to follow the mirror to 2")
        say(f"     followed: {md_ref} = {self.md_replicas()} after {time.monotonic() - started:.1f} s")

    def _show_event(self, reason: str, contains: str) -> None:
        """Print the Event ``reason`` whose message has ``contains`` (an earlier one of the same reason is not it)."""

        def found() -> Any:
            events = self.core.list_namespaced_event(cluster.METAL3_NAMESPACE).items
            return [
                e
                for e in events
                if e.reason == reason
                and e.involved_object.name == cluster.MACHINE_DEPLOYMENT
                and contains in (e.message or "")
            ]

        try:
            events = wait_for(found, BUSY_MACHINE_SECONDS / 4, f"a {reason} Event")
        except WaitTimeout:
            return  # Events are best effort (sent off the hot path); the heal itself was checked
        say = self.say
        say(f"     Event {reason} on the MachineDeployment: {events[-1].message}")

    def check_no_key(self) -> None:
        env = self.env
        assert env.seeded is not None
        key = env.seeded.slurm_key.decode()
        key_b64 = base64.b64encode(env.seeded.slurm_key).decode()
        if key in self.say.text or key_b64 in self.say.text:
            raise DemoError("slurm.key appeared in the demo output")
        for handler in logging.getLogger().handlers:
            handler.flush()
        lines = env.log_file.read_text(encoding="utf-8").splitlines() if env.log_file.exists() else []
        if any(key in line or key_b64 in line for line in lines):
            raise DemoError(f"slurm.key appeared in the webhooks' log ({env.log_file})")
        self.say.section(
            f"slurm.key appears nowhere in this output, nor in the {len(lines)} lines the webhooks logged."
        )

    def close(self) -> None:
        self.api.close()
