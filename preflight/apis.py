"""The APIs SliMe talks to: served, at a version SliMe speaks, with the resources it reads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from common.apis import CAPI_VERSIONS, METAL3_VERSIONS, SLINKY_VERSIONS
from common.kube import KubeClient
from common.names import CAPI_GROUP, INJECT_CA_FROM_ANNOTATION, METAL3_GROUP, SLINKY_GROUP
from preflight.context import Context, annotations_of
from preflight.report import Finding, fail, ok, skip


@dataclass(frozen=True)
class Api:
    """An API the product talks to: who needs it, and how to get it."""

    title: str
    group: str
    plurals: tuple[str, ...]
    versions: tuple[str, ...]  # what SliMe speaks, newest first
    needed_by: str
    fix: str


INJECTION_APIS = (
    Api(
        "Metal3 (CAPM3)",
        METAL3_GROUP,
        ("metal3datas", "metal3datatemplates"),
        METAL3_VERSIONS,
        "injection",
        "install CAPM3 (clusterctl init --infrastructure metal3)",
    ),
    Api(
        "Slinky",
        SLINKY_GROUP,
        ("controllers",),
        SLINKY_VERSIONS,
        "injection",
        "install Slinky's slurm-operator with its CRDs where slurmctld runs",
    ),
)
SCALING_APIS = (
    Api(
        "Cluster API",
        CAPI_GROUP,
        ("machinedeployments", "clusters"),
        CAPI_VERSIONS,
        "scaling",
        "install Cluster API (clusterctl init)",
    ),
)
MACHINES_API = Api(
    "Cluster API Machines", CAPI_GROUP, ("machines",), CAPI_VERSIONS, "safe scale-in", "install Cluster API"
)
HOSTS_API = Api(
    "Metal3 BareMetalHosts",
    "metal3.io",
    ("baremetalhosts",),
    ("v1alpha1",),
    "capacity-aware scale-up",
    "install the baremetal-operator",
)
KEDA_API = Api("KEDA", "keda.sh", ("scaledobjects",), ("v1alpha1",), "keda.enabled", "install KEDA")
CERT_MANAGER_API = Api(
    "cert-manager",
    "cert-manager.io",
    ("certificates", "issuers"),
    ("v1",),
    "certManager.enabled",
    "install cert-manager",
)


def apis(ctx: Context) -> Iterator[Finding]:
    wanted: list[Api] = []
    if ctx.install.injection:
        wanted += INJECTION_APIS
    if ctx.install.scaling:
        wanted += SCALING_APIS
        table = ctx.table()
        if any(m.safe_scale_in for m in table):
            wanted.append(MACHINES_API)
        if any(m.capacity_aware for m in table):
            wanted.append(HOSTS_API)
    optional = [KEDA_API] if ctx.install.scaling else []
    if any(INJECT_CA_FROM_ANNOTATION in annotations_of(c) for c in ctx.configurations().values()):
        wanted.append(CERT_MANAGER_API)
    for api in wanted:
        yield _api(ctx, api, required=True)
    for api in optional:
        yield _api(ctx, api, required=False)


def _api(ctx: Context, api: Api, required: bool) -> Finding:
    version, why = served(ctx.kube, api)
    plurals = ", ".join(f"{p}.{api.group}" for p in api.plurals)
    if version:
        return ok("api", f"{api.title}: {plurals} served at {version} (needed by {api.needed_by})")
    if required:
        return fail("api", f"{api.title} ({plurals}, needed by {api.needed_by}): {why}", api.fix)
    return skip("api", f"{api.title} ({plurals}): {why}; {api.needed_by} needs it")


def served(kube: KubeClient, api: Api) -> tuple[str, str]:
    """(the version SliMe will use, "") or ("", why it cannot)."""
    served = kube.served_versions(api.group)
    if not served:
        return "", f"{api.group} is not served by this cluster"
    usable = [v for v in served if v in api.versions]
    if not usable:
        return "", f"{api.group} is served at {', '.join(served)}, SliMe speaks {', '.join(api.versions)}"
    listed = kube.request("GET", f"/apis/{api.group}/{usable[0]}")
    names = {r.get("name") for r in listed.get("resources") or []}
    missing = [p for p in api.plurals if p not in names]
    if missing:
        return "", f"{api.group}/{usable[0]} does not serve {', '.join(missing)}"
    return usable[0], ""
