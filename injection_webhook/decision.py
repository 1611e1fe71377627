"""The injection decision, as pure functions: no I/O, no clock, no globals.

``select`` picks out the requests we act on: a Secret CREATE or UPDATE, owned by a Metal3Data,
with a ``metaData`` key. ``withheld`` says whether this requester may get join data at all: only
the configured identities (CAPM3's manager) on a request that is really stored, never a dry run.
``respond`` turns a resolution into the AdmissionResponse. The resolver between them
(``resolver.py``) is the only part that knows about clusters, and it resolves nothing before it
has verified the owner the review names against its caches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from common.admission import AdmissionResponse, allow, bounded, deny, patch_response, requester
from common.meta import is_dns1123_label, owner_reference
from common.names import METADATA_KEY, METAL3_GROUP
from injection_webhook.metadata import MetaDataError, join_entries, merged_metadata


@dataclass(frozen=True, slots=True)
class MetaDataSecret:
    """The facts of one admission request that the resolver and the patch need.

    Everything here comes from the review, so nothing here is trusted until the resolver has
    found the owner Metal3Data, with this uid, in its cache."""

    namespace: str
    name: str
    metal3data: str
    encoded_metadata: str
    metal3data_uid: str = ""  # the uid the owner reference names: only readers of Metal3Data know it
    requester: str = ""  # request.userInfo.username
    dry_run: bool = False
    metadata_unchanged: bool = False  # an UPDATE that leaves data.metaData as it was

    @property
    def ref(self) -> str:
        """For messages; the name comes from the review, so it is cut short."""
        return f"{self.namespace}/{bounded(self.name)}" if self.name else f"{self.namespace}/(generated name)"


@dataclass(frozen=True, slots=True)
class JoinInfo:
    """Where a new slurmd finds slurmctld, and the keys it needs. ``key_base64`` and
    ``jwt_key_base64`` are secret."""

    host: str
    port: int
    key_base64: str
    source: str  # e.g. "Controller slurm/slurm in cluster local": for messages and logs
    conf_server: str = ""  # "" means host:port; may list several host:port, tried in order
    hosts_file: str = ""  # /etc/hosts lines for the names slurm.conf gives slurmctld ("" when not an IP)
    node_conf: str = ""  # slurmd -Z --conf: the pool's NodeSet feature(s)
    controller_name: str = ""  # the SlurmctldHost name, when the template opts in
    jwt_key_base64: str = ""  # the auth/jwt key, when the template opts in

    @property
    def where(self) -> str:
        return self.conf_server or f"{self.host}:{self.port}"

    def __repr__(self) -> str:  # keep the keys out of any accidental repr in a log or traceback
        return (
            f"JoinInfo(conf_server={self.where!r}, controller_name={self.controller_name!r}, "
            f"jwt_key={'yes' if self.jwt_key_base64 else 'no'}, source={self.source!r})"
        )


@dataclass(frozen=True, slots=True)
class NotOptedIn:
    """The Metal3DataTemplate has no ``slurm-controller-namespace`` label: not a Slurm worker."""


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Opted in, but something needed is missing. ``reason`` names it and where."""

    reason: str


@dataclass(frozen=True, slots=True)
class Withheld:
    """Opted in, but the operator does not let this template have join data: its namespace is not bound to the
    Slurm namespace it names (UNBOUND), or it asks for extra join data templates may not choose (TEMPLATE_OPT_IN).

    Answered as a foreign requester is: allowed without join data, with a warning, a log line, a
    metric and an Event; ``why`` says which rule and how the operator grants it."""

    reason: str
    why: str


@dataclass(frozen=True, slots=True)
class Unverified:
    """The review names an owner the caches do not hold (no such Metal3Data there, or another uid).

    Its answer is one message for every such case, so it tells the sender nothing about what
    exists."""


Resolution = JoinInfo | NotOptedIn | Unresolved | Withheld | Unverified

# Why join data is withheld: the values of slime_injection_join_data_withheld_total{reason}.
DRY_RUN = "dry-run"
REQUESTER = "requester"
UNBOUND = "unbound-namespace"
TEMPLATE_OPT_IN = "template-opt-in"
WITHHELD_REASONS = (DRY_RUN, REQUESTER, UNBOUND, TEMPLATE_OPT_IN)
# What a requester sees when join data is withheld (slime-check reads the first as proof that a
# dry run reached the webhook). Each at most 120 characters, as warnings should be.
WARNINGS = {
    DRY_RUN: "SliMe added no Slurm join data: this is a dry run",
    REQUESTER: "SliMe added no Slurm join data: this requester may not receive it",
    UNBOUND: "SliMe added no Slurm join data: this namespace is not bound to the Slurm namespace its template names",
    TEMPLATE_OPT_IN: "SliMe added no Slurm join data: the template asks for join data templates may not choose",
}
DRY_RUN_WARNING = WARNINGS[DRY_RUN]


def metal3data_owner(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the Metal3Data owning this object, matched by kind and group, any version.

    An owner whose name the API server would not accept cannot be a real Metal3Data, so the
    request is not ours (and such a name never reaches a URL)."""
    return owner_reference(metadata, "Metal3Data", METAL3_GROUP)


def select(request: dict[str, Any]) -> MetaDataSecret | None:
    """The Metal3 metadata Secret in this request, or None when the request is not ours."""
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return None
    kind = request.get("kind")
    if not isinstance(kind, dict) or kind.get("kind") != "Secret" or kind.get("group", "") != "":
        return None
    obj = request.get("object")
    if not isinstance(obj, dict):
        return None
    metadata = obj.get("metadata")
    data = obj.get("data")
    if not isinstance(metadata, dict) or not isinstance(data, dict):
        return None
    encoded = data.get(METADATA_KEY)
    owner = metal3data_owner(metadata)
    if owner is None or not isinstance(encoded, str):
        return None
    namespace = request.get("namespace") or metadata.get("namespace")
    if not isinstance(namespace, str) or not is_dns1123_label(namespace):
        return None
    name = metadata.get("name")
    uid = owner.get("uid")
    old = request.get("oldObject")
    old_data = old.get("data") if isinstance(old, dict) else None
    return MetaDataSecret(
        namespace=namespace,
        name=name if isinstance(name, str) else "",
        metal3data=str(owner["name"]),
        metal3data_uid=uid if isinstance(uid, str) else "",
        encoded_metadata=encoded,
        requester=requester(request),
        dry_run=request.get("dryRun") is True,
        metadata_unchanged=isinstance(old_data, dict) and old_data.get(METADATA_KEY) == encoded,
    )


def withheld(secret: MetaDataSecret, allowed_requesters: frozenset[str]) -> str | None:
    """Why this request gets no join data whatever its owner (DRY_RUN or REQUESTER), or None.

    A dry run is never stored, so its answer would hand the key to whoever asked for it; and
    only the configured identities (CAPM3's manager) create the Secrets nodes boot from."""
    if secret.dry_run:
        return DRY_RUN
    if secret.requester not in allowed_requesters:
        return REQUESTER
    return None


def withhold(secret: MetaDataSecret, reason: str, why: str = "") -> AdmissionResponse:
    """Allowed without join data, with a warning the requester sees and a message for the log."""
    if reason == DRY_RUN:
        why = "a server-side dry run (join data is only added to Secrets that are stored)"
    elif reason == REQUESTER:
        why = f"requester {bounded(secret.requester) or '(none)'} is not one of the requesters allowed join data"
    return replace(allow(f"Slurm join data withheld from Secret {secret.ref}: {why}"), warnings=(WARNINGS[reason],))


def unverified_message(secret: MetaDataSecret) -> str:
    return (
        f"cannot inject Slurm join data into Secret {secret.ref}: its owner reference does not name a Metal3Data "
        "SliMe can verify (CAPM3 creates this Secret owned by its Metal3Data, with that Metal3Data's uid)"
    )


def join_data(resolution: JoinInfo) -> dict[str, str]:
    """The metaData keys a resolution adds (secret: holds the key)."""
    return join_entries(
        resolution.host,
        resolution.port,
        resolution.key_base64,
        conf_server=resolution.conf_server,
        hosts_file=resolution.hosts_file,
        node_conf=resolution.node_conf,
        controller_name=resolution.controller_name,
        jwt_key_base64=resolution.jwt_key_base64,
    )


def respond(secret: MetaDataSecret, resolution: Resolution) -> AdmissionResponse:
    """The admission answer for a selected Secret, given what the resolver found."""
    if isinstance(resolution, NotOptedIn):
        return allow()
    if isinstance(resolution, Unverified):
        return deny(unverified_message(secret))
    if isinstance(resolution, Unresolved):
        return deny(f"cannot inject Slurm join data into Secret {secret.ref}: {resolution.reason}")
    if isinstance(resolution, Withheld):
        return withhold(secret, resolution.reason, resolution.why)
    try:
        encoded = merged_metadata(secret.encoded_metadata, join_data(resolution))
    except MetaDataError as exc:
        return deny(f"cannot inject Slurm join data into Secret {secret.ref}: {exc}", code=400, reason="BadRequest")
    where = f"slurmctld {resolution.where}"
    if encoded is None:
        return allow(f"Secret {secret.ref} already carries the Slurm join data for {where}")
    return patch_response(
        [{"op": "replace", "path": f"/data/{METADATA_KEY}", "value": encoded}],
        f"added the Slurm join data for {where} to Secret {secret.ref}",
    )
