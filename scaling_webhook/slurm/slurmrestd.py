"""A small synchronous slurmrestd client for safe scale-in and node demand (Slurm API v0.0.42 to v0.0.46).

Authentication is Slinky's: an HS256 JWT signed with the ``jwt_hs256.key`` held in a Kubernetes
Secret, with claims ``sun`` (the Slurm user), ``iat`` and ``exp`` (60 s later), sent in the
``X-SLURM-USER-TOKEN`` header. The key is read once through the webhook's KubeClient and cached;
a 401 from slurmrestd drops it so the next call reads the Secret again (key rotation).

Every failure raises :class:`SlurmUnavailable` with a message fit for an Event. Neither the
token nor the key ever appears in a message or a log line.

What real slurmrestd 24.11 and 26.05 answer (checked against both, docs/scaling.md): a token it cannot
verify gets 511 (error 1007), a request without one 401; both make the client read the key
again once. A node request slurmctld refuses gets 500 (24.11) or 422 (26.05) with an error
number: 2018 for a node that does not exist, which a DELETE or a return to FUTURE treats as
"gone" (nothing left to do); 2016 for deleting a busy node; 2028 (24.11) or 2180 (26.05) for
returning a busy node, or one already FUTURE, to FUTURE. The client goes by the error number,
never by the status.

The version is the mapping's ``apiVersion``, else the newest of :data:`SLURM_API_VERSIONS` whose
``/slurm/<v>/ping`` answers (an unserved version's URL answers 404 on every release). Nothing here
uses slurmrestd's ``/healthz``, ``/readyz`` or ``/livez``: 24.11 and 25.x never served them and
26.11 drops them again. A discovered version that later answers 404 (slurmrestd was upgraded past
it, e.g. v0.0.42 to Slurm 26.11) is forgotten, so the next call probes again.
"""

from __future__ import annotations

import logging
import threading
import time
from base64 import b64decode
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import jwt

from common.apis import SECRETS
from common.kube import KubeClient, KubeError
from scaling_webhook.slurm.endpoint import SLURM_API_VERSIONS, SlurmEndpoint

log = logging.getLogger("slime.scaling.slurmrestd")

TOKEN_LIFETIME_SECONDS = 60
TIMEOUT_SECONDS = 2.0
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
# 401: no token; 511 (Network Authentication Required, error 1007): a token slurmrestd cannot verify.
AUTH_FAILURES = (401, 511)
INVALID_NODE_NAME = 2018  # slurm_errno ESLURM_INVALID_NODE_NAME: no such node (any more)
FUTURE = "FUTURE"  # the node state slurmctld keeps a record in without a host behind it


class SlurmUnavailable(Exception):
    """slurmrestd (or the signing key) cannot be used now; ``cause`` says why."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class JobListing:
    """One ``GET jobs``: the jobs (None: unchanged since the ``update_time`` asked about) and slurmctld's
    ``last_update`` to ask about next time (None when it gave none)."""

    jobs: list[dict[str, Any]] | None
    last_update: int | None


class _NodeGone(Exception):
    """slurmctld has no record of the node (error 2018): a DELETE or a return to FUTURE has nothing left to do."""


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    hostname: str = ""
    address: str = ""
    states: frozenset[str] = field(default_factory=frozenset)
    reason: str = ""
    reason_set_by_user: str = ""  # who set the reason: an admin's name, or SlurmUser when slurmctld set it
    reason_changed_at: int | None = None  # when the reason was set (epoch seconds; None when unset)

    @property
    def busy(self) -> bool:
        return bool(self.states & BUSY_STATES)

    @property
    def drained(self) -> bool:
        """Slurm's own test (and Slinky's): DRAIN and nothing running or completing."""
        return "DRAIN" in self.states and not self.busy


class SlurmNodes(list[SlurmNode]):
    """Slurm's node list as one read returned it, with its lookups by name and by any of name, hostname and
    address built once, on first use: a pass matches every Machine of a pool against the same list, and a
    scan per Machine would make that pass grow with the square of the pool."""

    _lookups: tuple[dict[str, int], dict[str, int]] | None = None

    def lookups(self) -> tuple[dict[str, int], dict[str, int]]:
        """(name -> position, name/hostname/address -> position), each the first node in the list that has it."""
        if self._lookups is None:
            by_name: dict[str, int] = {}
            by_any: dict[str, int] = {}
            for position, node in enumerate(self):
                by_name.setdefault(node.name, position)
                for key in (node.name, node.hostname, node.address):
                    if key:
                        by_any.setdefault(key, position)
            self._lookups = (by_name, by_any)
        return self._lookups


def _states(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        value = value.replace("+", " ").split()
    if not isinstance(value, list):
        return frozenset()
    return frozenset(str(s).upper() for s in value if isinstance(s, str))


def parse_node(raw: dict[str, Any]) -> SlurmNode:
    return SlurmNode(
        name=str(raw.get("name") or ""),
        hostname=str(raw.get("hostname") or ""),
        address=str(raw.get("address") or ""),
        states=_states(raw.get("state")),
        reason=str(raw.get("reason") or ""),
        reason_set_by_user=str(raw.get("reason_set_by_user") or ""),
        reason_changed_at=_timestamp(raw.get("reason_changed_at")),
    )


class SlurmClient:
    """One slurmrestd endpoint with its signing key. Thread-safe."""

    def __init__(self, kube: KubeClient, config: SlurmEndpoint, timeout: float = TIMEOUT_SECONDS) -> None:
        self.kube = kube
        self.config = config
        self.timeout = timeout
        self._key: bytes | None = None
        self._version: str | None = config.api_version
        self._lock = threading.Lock()
        self._http = httpx.Client(base_url=config.slurmrestd, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    @property
    def where(self) -> str:
        return f"slurmrestd {self.config.slurmrestd}"

    # --- auth --------------------------------------------------------------------------------

    def _signing_key(self) -> bytes:
        key = self._key
        if key is not None:
            return key
        namespace, name = self.config.jwt_secret
        try:
            secret = self.kube.request("GET", SECRETS.item(namespace, name), timeout=5.0)
        except KubeError as exc:
            raise SlurmUnavailable(
                f"cannot read the JWT signing key Secret {namespace}/{name}: {exc.status or ''} {exc.reason}".replace(
                    "  ", " "
                )
            ) from None
        encoded = (secret.get("data") or {}).get(self.config.jwt_key)
        if not isinstance(encoded, str) or not encoded:
            raise SlurmUnavailable(f"Secret {namespace}/{name} has no key {self.config.jwt_key!r}")
        try:
            key = b64decode(encoded, validate=True)
        except ValueError:
            raise SlurmUnavailable(
                f"Secret {namespace}/{name} key {self.config.jwt_key!r} is not valid base64"
            ) from None
        self._key = key
        return key

    def _token(self) -> str:
        now = int(time.time())
        claims = {"sun": self.config.token_user, "iat": now, "exp": now + TOKEN_LIFETIME_SECONDS}
        return jwt.encode(claims, self._signing_key(), algorithm="HS256")

    # --- transport ---------------------------------------------------------------------------

    def _call(
        self, method: str, path: str, body: Any = None, gone_raises: bool = False, missing_ok: bool = False
    ) -> dict[str, Any]:
        """One request (signed, the key read again once after 401/511);
        with ``gone_raises``, error 2018 (no such node) raises :class:`_NodeGone`; with ``missing_ok``, a 200
        whose errors say the node could not be found is an answer with no node, not a failure."""
        for attempt in (1, 2):
            headers = {"X-SLURM-USER-TOKEN": self._token(), "Accept": "application/json"}
            try:
                response = self._http.request(method, path, headers=headers, json=body)
            except httpx.TimeoutException:
                raise SlurmUnavailable(
                    f"{self.where} did not answer {method} {path} within {self.timeout:g}s"
                ) from None
            except httpx.HTTPError as exc:
                raise SlurmUnavailable(f"cannot reach {self.where}: {type(exc).__name__}: {exc}") from None
            if response.status_code in AUTH_FAILURES:
                if attempt == 2:
                    raise SlurmUnavailable(
                        f"{self.where} refused the JWT ({response.status_code}) twice; check jwtSecret/jwtKey/tokenUser"
                    )
                log.warning(
                    "slurmrestd refused the token; reading the signing key again",
                    extra={"slurmrestd": self.config.slurmrestd},
                )
                self._key = None
                continue
            if gone_raises and _error_numbers(response) == {INVALID_NODE_NAME}:
                raise _NodeGone(path)
            if response.status_code == 404:
                self._forget_version(path)
            if not 200 <= response.status_code <= 299:
                raise SlurmUnavailable(
                    f"{self.where} answered {response.status_code} to {method} {path}{_errors(response)}"
                )
            try:
                data = response.json() if response.content else {}
            except ValueError:
                raise SlurmUnavailable(f"{self.where} answered {method} {path} with a body that is not JSON") from None
            problems = _errors_of(data)
            if problems and missing_ok and not (data.get("nodes") if isinstance(data, dict) else None):
                return {"nodes": []}
            if problems:
                raise SlurmUnavailable(f"{self.where} reported errors for {method} {path}: {problems}")
            return data if isinstance(data, dict) else {}
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _forget_version(self, path: str) -> None:
        """A 404 under the discovered version: slurmrestd no longer serves it (upgraded); probe again next call."""
        version = self._version
        if self.config.api_version is None and version is not None and path.startswith(f"/slurm/{version}/"):
            with self._lock:
                if self._version == version:
                    self._version = None
                    log.warning(
                        "slurmrestd no longer serves the API version in use; probing again",
                        extra={"slurmrestd": self.config.slurmrestd, "api_version": version},
                    )

    def version(self) -> str:
        """The API version to use: the configured one, else the newest that answers ``/ping``."""
        version = self._version
        if version is not None:
            return version
        with self._lock:
            if self._version is None:
                self._signing_key()  # a Secret problem is named as itself, not as every version refused
                tried = []
                for candidate in SLURM_API_VERSIONS:
                    try:
                        self._call("GET", f"/slurm/{candidate}/ping")
                    except SlurmUnavailable as exc:
                        tried.append(f"{candidate}: {exc.cause}")
                        if "cannot reach" in exc.cause or "did not answer" in exc.cause:
                            raise
                        continue
                    self._version = candidate
                    log.info(
                        "slurmrestd API version discovered",
                        extra={"slurmrestd": self.config.slurmrestd, "api_version": candidate},
                    )
                    break
                else:
                    raise SlurmUnavailable(
                        f"{self.where} serves none of {', '.join(SLURM_API_VERSIONS)} ({'; '.join(tried)})"
                    )
            return self._version

    # --- calls -------------------------------------------------------------------------------

    def nodes(self) -> SlurmNodes:
        listed = self._list("nodes", f"/slurm/{self.version()}/nodes/")
        return SlurmNodes(parse_node(n) for n in listed if n.get("name"))

    def node(self, name: str) -> SlurmNode | None:
        """One node, read now (``GET node/<name>``): the fresh read a release or a drain is decided on.

        None when slurmctld has no such node to show: it answers an unknown name (and a record
        returned to FUTURE, which it hides) with no node and an error, not a failure of the call."""
        data = self._call("GET", f"/slurm/{self.version()}/node/{quote(name)}", missing_ok=True)
        found = [parse_node(n) for n in data.get("nodes") or [] if isinstance(n, dict) and n.get("name") == name]
        if not found or FUTURE in found[0].states:
            return None
        return found[0]

    def jobs(self, since: int | None = None) -> JobListing:
        """Every job slurmctld knows (pending, running and recently finished), as slurmrestd lists them;
        with ``since`` (a ``last_update`` it gave before), ``jobs=None`` when no job changed since then.

        slurmctld answers an ``update_time`` it has no newer change for with no jobs, no
        ``last_update`` and a warning ("No job changes since update_time..."): the cheap answer to
        the most frequent question at a large queue. A listing that is really empty carries a
        ``last_update``, so the two are never confused."""
        path = f"/slurm/{self.version()}/jobs/" + (f"?update_time={since}" if since else "")
        data = self._call("GET", path)
        raw = data.get("jobs")
        if not isinstance(raw, list):
            raise SlurmUnavailable(f"{self.where} answered GET jobs without a jobs list")
        last_update = _timestamp(data.get("last_update"))
        if since and not raw and last_update is None:
            return JobListing(None, since)
        return JobListing([item for item in raw if isinstance(item, dict)], last_update)

    def partitions(self) -> list[dict[str, Any]]:
        return self._list("partitions", f"/slurm/{self.version()}/partitions/")

    def _list(self, key: str, path: str) -> list[dict[str, Any]]:
        raw = self._call("GET", path).get(key)
        if not isinstance(raw, list):
            raise SlurmUnavailable(f"{self.where} answered GET {key} without a {key} list")
        return [item for item in raw if isinstance(item, dict)]

    def drain(self, name: str, reason: str) -> None:
        self._call("POST", f"/slurm/{self.version()}/node/{quote(name)}", {"state": ["DRAIN"], "reason": reason})

    def undrain(self, name: str) -> None:
        """Remove the DRAIN flag (``UNDRAIN``, accepted by slurmrestd since v0.0.40)."""
        self._call("POST", f"/slurm/{self.version()}/node/{quote(name)}", {"state": ["UNDRAIN"]})

    def delete(self, name: str) -> bool:
        """Delete a node's record; False when it was gone already (fine: nothing left to delete)."""
        try:
            self._call("DELETE", f"/slurm/{self.version()}/node/{quote(name)}", gone_raises=True)
        except _NodeGone:
            return False
        return True

    def future(self, name: str) -> bool:
        """Return an idle node to FUTURE; False when slurmctld has no record of it (any more).

        Real slurmctld (24.11 and 26.05) keeps the record (hidden from ``GET nodes``, still one
        of its partition's nodes, so a job that needs it is accepted and queues), clears DRAIN
        (26.05 clears the reason with it; 24.11 keeps it until the node next runs a job), and the
        next ``slurmd -Z`` of that name takes the record again, IDLE. That holds for a node that
        took a FUTURE record an operator declared and for one ``slurmd -Z`` created. A busy node,
        or one already FUTURE, is refused (error 2028 on 24.11, 2180 on 26.05), which raises
        :class:`SlurmUnavailable`.
        """
        try:
            self._call("POST", f"/slurm/{self.version()}/node/{quote(name)}", {"state": [FUTURE]}, gone_raises=True)
        except _NodeGone:
            return False
        return True


def _timestamp(value: Any) -> int | None:
    """A time slurmrestd gives as ``{"set": true, "number": N}`` (v0.0.40 on) or a bare number; None when unset or 0."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _errors_of(data: Any) -> str:
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list) or not errors:
        return ""
    parts = []
    for error in errors[:3]:
        if isinstance(error, dict):
            words = [str(error[k])[:200] for k in ("description", "error") if error.get(k)]
            parts.append(f"{words[0]} ({words[1]})" if len(words) == 2 else words[0] if words else str(error)[:200])
    return "; ".join(parts)


def _error_numbers(response: httpx.Response) -> set[int]:
    """The ``error_number`` of each error in a JSON answer (empty when there are none or it is not JSON)."""
    try:
        errors = response.json().get("errors")
    except (ValueError, AttributeError):
        return set()
    if not isinstance(errors, list):
        return set()
    return {e["error_number"] for e in errors if isinstance(e, dict) and isinstance(e.get("error_number"), int)}


def _errors(response: httpx.Response) -> str:
    try:
        text = _errors_of(response.json())
    except ValueError:
        text = ""
    return f": {text}" if text else ""
