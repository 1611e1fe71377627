"""The scaling side: every mapping (its mirror, its pool, KEDA's ScaledObject) and the slurmrestd it reads."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import httpx

from common.apis import CAPI_VERSIONS, CONFIGMAPS, DEPLOYMENTS
from common.kube import ResourcePath
from common.names import CAPI_GROUP, DEPLOYMENT_NAME_LABEL
from preflight.apis import KEDA_API, served
from preflight.context import Context, metadata_of, ref_of
from preflight.report import Finding, fail, ok, skip, warn
from scaling_webhook.decision import autoscaler_annotations, pause_reason, replicas_of, target_replicas
from scaling_webhook.machine_health.service import condition_of
from scaling_webhook.mappings import Mapping, MappingError, parse_mappings
from scaling_webhook.slurm.endpoint import SLURM_API_VERSIONS, SlurmEndpoint
from scaling_webhook.slurm.slurmrestd import SlurmClient, SlurmUnavailable


def mappings(ctx: Context) -> Iterator[Finding]:
    settings = ctx.scaling
    if settings is None:
        return
    where = f"ConfigMap {settings.namespace}/{settings.config_map}"
    configmap = ctx.read(CONFIGMAPS.item(settings.namespace, settings.config_map))
    if configmap is None:
        yield fail(
            "mapping",
            f"{where} (scaling.configMapName) does not exist",
            "scaling.createConfigMap=true, or create it (docs/interfaces.md)",
        )
        return
    try:
        table = parse_mappings(configmap.get("data"), settings.namespace)
    except MappingError as exc:
        yield fail(
            "mapping",
            f"{where} is invalid (the webhook keeps its last good mappings): {exc}",
            "correct scaling.mappings (docs/interfaces.md)",
        )
        return
    if not table:
        yield warn(
            "mapping",
            f"{where} maps nothing: the scaling webhook has no pool to follow",
            "set scaling.mappings (docs/install.md)",
        )
        return
    md_path = ctx.kube.resource(CAPI_GROUP, "machinedeployments", CAPI_VERSIONS)
    keda = served(ctx.kube, KEDA_API)[0]
    for mapping in table:
        yield from _mapping(ctx, mapping, md_path, keda)


def _mapping(ctx: Context, mapping: Mapping, md_path: ResourcePath, keda: str) -> Iterator[Finding]:
    mirror_ref, md_ref = mapping.mirror_ref, mapping.machine_deployment_ref
    title = f"mirror {mirror_ref} -> MachineDeployment {md_ref}"
    mirror = ctx.read(DEPLOYMENTS.item(*mapping.mirror))
    md = ctx.read(md_path.item(*mapping.machine_deployment))
    if mirror is None:
        yield fail(
            "mapping", f"{title}: the mirror Deployment does not exist", "scaling.createMirrors=true, or create it"
        )
    if md is None:
        yield fail("mapping", f"{title}: the MachineDeployment does not exist", "create it, or correct the mapping")
    if mirror is None or md is None:
        return
    managed = autoscaler_annotations(md)
    if managed:
        yield fail(
            "mapping",
            f"{title}: the MachineDeployment is a cluster-autoscaler node group ({', '.join(managed)}): SliMe never "
            "writes it",
            "remove the mapping or the autoscaler's annotations: one writer per MachineDeployment",
        )
        return
    cluster_name = (md.get("spec") or {}).get("clusterName")
    cluster = (
        ctx.read(
            ResourcePath(CAPI_GROUP, md_path.version, "clusters").item(mapping.machine_deployment[0], cluster_name)
        )
        if cluster_name
        else None
    )
    paused = pause_reason(mapping, md, cluster)
    mirror_replicas = replicas_of(mirror)
    md_replicas = replicas_of(md)
    mirror_replicas = 1 if mirror_replicas is None else mirror_replicas
    md_replicas = 1 if md_replicas is None else md_replicas
    bound = f", maxReplicas {mapping.max_replicas}" if mapping.max_replicas is not None else ""
    state = f"{title}: mirror {mirror_replicas}, MachineDeployment {md_replicas}{bound}"
    found_problem = False
    if paused:
        found_problem = True
        yield warn("mapping", f"{state}; it waits: {paused}", "unpause it when the pool may move")
    if mapping.max_replicas is not None and md_replicas > mapping.max_replicas:
        found_problem = True
        yield fail(
            "mapping",
            f"{state}: the MachineDeployment is above maxReplicas",
            "raise maxReplicas (or keda.maxReplicaCount), or scale the mirror down: the leader will lower the pool",
        )
    elif not paused and md_replicas != target_replicas(mapping, mirror_replicas):
        found_problem = True
        yield warn(
            "mapping",
            f"{state}: the MachineDeployment has not followed the mirror (yet)",
            f"kubectl -n {ctx.install.namespace} get lease (one replica must hold it), and the scaling webhook's log",
        )
    if keda:
        yield from _scaled_object(ctx, mapping, title)
    if not found_problem:
        yield ok("mapping", state)


def _scaled_object(ctx: Context, mapping: Mapping, title: str) -> Iterator[Finding]:
    path = ResourcePath(KEDA_API.group, KEDA_API.versions[0], "scaledobjects")
    namespaces = {mapping.mirror[0], mapping.machine_deployment[0]}
    objects = [o for ns in sorted(namespaces) for o in ctx.read_all(path.collection(ns))]
    on_md = [
        o
        for o in objects
        if metadata_of(o).get("namespace") == mapping.machine_deployment[0]
        and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == mapping.machine_deployment[1]
        and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("kind") == "MachineDeployment"
    ]
    for obj in on_md:
        yield fail(
            "mapping",
            f"{title}: ScaledObject {ref_of(obj)} scales the MachineDeployment itself: two writers",
            "point the ScaledObject at the mirror (keda.enabled=true renders it)",
        )
    on_mirror = [
        o
        for o in objects
        if metadata_of(o).get("namespace") == mapping.mirror[0]
        and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == mapping.mirror[1]
        and ((o.get("spec") or {}).get("scaleTargetRef") or {}).get("kind", "Deployment") == "Deployment"
    ]
    if on_mirror:
        yield ok("mapping", f"{title}: ScaledObject {', '.join(ref_of(o) for o in on_mirror)} scales the mirror")
    else:
        yield warn(
            "mapping",
            f"{title}: no ScaledObject targets the mirror: nothing scales it",
            "keda.enabled=true, or point your own ScaledObject or HPA at the mirror",
        )


def slurmrestd(ctx: Context) -> Iterator[Finding]:
    if ctx.scaling is None:
        return
    endpoints: dict[SlurmEndpoint, list[str]] = {}
    for mapping in ctx.table():
        blocks = (
            ("safeScaleIn", mapping.safe_scale_in),
            ("nodeDemand", mapping.node_demand),
            ("slurmHealth", mapping.slurm_health),
        )
        for block, config in blocks:
            if config is not None:
                endpoints.setdefault(config.endpoint, []).append(f"{mapping.source} {block}")
    for endpoint, users in endpoints.items():
        yield _slurmrestd(ctx, endpoint, users)


def _slurmrestd(ctx: Context, endpoint: SlurmEndpoint, users: list[str]) -> Finding:
    url = ctx.options.slurmrestd.get(endpoint.slurmrestd, endpoint.slurmrestd)
    via = f" (reached at {url})" if url != endpoint.slurmrestd else ""
    secret = f"{endpoint.jwt_secret[0]}/{endpoint.jwt_secret[1]}"
    title = f"{endpoint.slurmrestd}{via} for {', '.join(users)}"
    client = SlurmClient(ctx.kube, replace(endpoint, slurmrestd=url), timeout=ctx.options.timeout)
    try:
        version = client.version()
        # slurmrestd answers /ping even with a token it cannot verify (pinged: DOWN): the node list proves the JWT.
        nodes = len(client.nodes())
    except SlurmUnavailable as exc:
        cause = exc.cause
        if "cannot read the JWT signing key Secret" in cause and " 403" in cause:
            return _slurmrestd_unsigned(ctx, endpoint, url, title, secret)
        if "cannot reach" in cause or "did not answer" in cause:
            return fail(
                "slurmrestd",
                f"{title}: {cause}",
                f"run slime-check where that name resolves (helm test {ctx.install.release} -n {ctx.install.namespace} "
                "runs it in the cluster), "
                f"or through kubectl port-forward: --slurmrestd {endpoint.slurmrestd}=http://127.0.0.1:<port>",
            )
        if "refused the JWT" in cause:
            return fail(
                "slurmrestd",
                f"{title}: {cause}",
                f"the key in Secret {secret} ({endpoint.jwt_key}) is not the one slurmrestd verifies with, or Slurm "
                f"does not know user {endpoint.token_user}",
            )
        return fail("slurmrestd", f"{title}: {cause}", "correct jwtSecret/jwtKey/tokenUser/apiVersion in the mapping")
    finally:
        client.close()
    chosen = "configured" if endpoint.api_version else f"the newest of {', '.join(SLURM_API_VERSIONS)} it serves"
    return ok(
        "slurmrestd",
        f"{title}: lists {nodes} node(s) with a JWT signed by Secret {secret} as user {endpoint.token_user}; "
        f"data parser {version} ({chosen})",
    )


def _slurmrestd_unsigned(ctx: Context, endpoint: SlurmEndpoint, url: str, title: str, secret: str) -> Finding:
    """No access to the JWT key from here: is slurmrestd there at all, and may the scaling webhook read the key?"""
    component = ctx.install.scaling
    may = ctx.may(component.username, "get", "secrets", *endpoint.jwt_secret) if component else None
    rbac = {
        True: "the scaling webhook's ServiceAccount may read it",
        False: "the scaling webhook's ServiceAccount may NOT read it",
        None: "the webhook's RBAC not checked",
    }[may]
    version = endpoint.api_version or SLURM_API_VERSIONS[-1]
    try:
        answer = httpx.get(f"{url}/slurm/{version}/ping", timeout=ctx.options.timeout)
    except (httpx.HTTPError, socket.gaierror) as exc:
        return fail(
            "slurmrestd",
            f"{title}: cannot reach it: {type(exc).__name__}: {exc}",
            "run slime-check where that name resolves, or with --slurmrestd",
        )
    if may is False:
        return fail(
            "slurmrestd",
            f"{title}: reachable (HTTP {answer.status_code} without a token); Secret {secret}: {rbac}",
            "list the Secret in scaling.safeScaleIn.jwtSecrets or scaling.nodeDemand.jwtSecret",
        )
    return skip(
        "slurmrestd",
        f"{title}: reachable (HTTP {answer.status_code} without a token); the JWT not tried: Secret {secret} not "
        f"readable by this identity ({rbac})",
    )


def health(ctx: Context) -> Iterator[Finding]:
    """Each slurmHealth pool's Machines that the leader judged not working Slurm nodes (its condition on them)."""
    if ctx.scaling is None:
        return
    pools = [m for m in ctx.table() if m.slurm_health is not None]
    if not pools:
        return
    machines = ctx.kube.resource(CAPI_GROUP, "machines", CAPI_VERSIONS)
    for mapping in pools:
        config = mapping.slurm_health
        assert config is not None
        namespace, name = mapping.machine_deployment
        pool = ctx.read_all(machines.collection(namespace), selector=f"{DEPLOYMENT_NAME_LABEL}={name}")
        unhealthy = []
        for machine in pool:
            condition = condition_of(machine)
            if condition is not None and condition.get("status") == "False":
                unhealthy.append(
                    f"{metadata_of(machine).get('name')} ({condition.get('reason')}: {condition.get('message')})"
                )
        mode = "remediate" if config.remediate else "report only"
        pool_ref = mapping.machine_deployment_ref
        title = f"MachineDeployment {pool_ref} (slurmHealth, {mode}, maxUnhealthy {config.max_unhealthy})"
        if unhealthy:
            yield warn(
                "health",
                f"{title}: {len(unhealthy)} of {len(pool)} Machine(s) are not working Slurm nodes: "
                + "; ".join(sorted(unhealthy)),
                "docs/operations.md, 'A Machine is not a working Slurm node'",
            )
        else:
            yield ok("health", f"{title}: none of its {len(pool)} Machine(s) is judged unhealthy")
