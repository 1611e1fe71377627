"""The injection decision, as pure functions: no I/O, no clock, no globals.

``select`` picks out the requests we act on: a Secret CREATE or UPDATE, owned by a Metal3Data,
with a ``metaData`` key. ``respond`` turns a resolution into the AdmissionResponse. The resolver
between them (``resolver.py``) is the only part that knows about clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.admission import AdmissionResponse, allow, deny, patch_response
from common.meta import is_dns1123_label, owner_reference
from common.names import CLUSTER_NAME_LABEL, METADATA_KEY, METAL3_GROUP
from injection_webhook.metadata import MetaDataError, join_entries, merged_metadata


@dataclass(frozen=True, slots=True)
class MetaDataSecret:
    """The facts of one admission request that the resolver and the patch need."""

    namespace: str
    name: str
    metal3data: str
    cluster_name: str
    encoded_metadata: str
    metal3data_uid: str = ""  # the uid the owner reference names: only readers of Metal3Data know it

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"{self.namespace}/(generated name)"


@dataclass(frozen=True, slots=True)
class JoinInfo:
    """Where a new slurmd finds slurmctld, and the keys it needs. ``key_base64`` and
    ``jwt_key_base64`` are secret."""

    host: str
    port: int
    key_base64: str
    source: str  # e.g. "Controller slurm/slurm in cluster local": for messages and logs
    metal3data_uid: str = ""  # the uid of the owner Metal3Data as the cluster has it
    conf_server: str = ""  # "" means host:port; may list several host:port, tried in order
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


Resolution = JoinInfo | NotOptedIn | Unresolved


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
    labels = metadata.get("labels")
    cluster = labels.get(CLUSTER_NAME_LABEL) if isinstance(labels, dict) else None
    namespace = request.get("namespace") or metadata.get("namespace")
    if not isinstance(namespace, str) or not is_dns1123_label(namespace):
        return None
    name = metadata.get("name")
    uid = owner.get("uid")
    return MetaDataSecret(
        namespace=namespace,
        name=name if isinstance(name, str) else "",
        metal3data=str(owner["name"]),
        metal3data_uid=uid if isinstance(uid, str) else "",
        cluster_name=cluster if isinstance(cluster, str) else "",
        encoded_metadata=encoded,
    )


def respond(secret: MetaDataSecret, resolution: Resolution) -> AdmissionResponse:
    """The admission answer for a selected Secret, given what the resolver found."""
    if isinstance(resolution, NotOptedIn):
        return allow()
    if isinstance(resolution, Unresolved):
        return deny(f"cannot inject Slurm join data into Secret {secret.ref}: {resolution.reason}")
    if not secret.metal3data_uid or secret.metal3data_uid != resolution.metal3data_uid:
        # Join data only for a review consistent with the cluster: CAPM3 creates this Secret with
        # the uid of its Metal3Data, which only readers of Metal3Data know. The answer says which
        # owner, never which uid was expected.
        return deny(
            f"cannot inject Slurm join data into Secret {secret.ref}: its owner reference names Metal3Data "
            f"{secret.namespace}/{secret.metal3data} with a uid that Metal3Data does not have; CAPM3 creates this "
            "Secret with the uid of its Metal3Data"
        )
    entries = join_entries(
        resolution.host,
        resolution.port,
        resolution.key_base64,
        conf_server=resolution.conf_server,
        controller_name=resolution.controller_name,
        jwt_key_base64=resolution.jwt_key_base64,
    )
    try:
        encoded = merged_metadata(secret.encoded_metadata, entries)
    except MetaDataError as exc:
        return deny(f"cannot inject Slurm join data into Secret {secret.ref}: {exc}", code=400, reason="BadRequest")
    where = f"slurmctld {resolution.where}"
    if encoded is None:
        return allow(f"Secret {secret.ref} already carries the Slurm join data for {where}")
    return patch_response(
        [{"op": "replace", "path": f"/data/{METADATA_KEY}", "value": encoded}],
        f"added the Slurm join data for {where} to Secret {secret.ref}",
    )
