"""Kubernetes API access for both services, on top of the official ``kubernetes`` client.

We use the client's transport (kubeconfig and in-cluster auth, TLS, connection pool) but speak
raw paths and plain dicts. The typed models would cost a deserialisation per object and drop
fields they do not know, and CRDs (Metal3, CAPI, Slinky) have no models anyway.

Two kinds of cluster: the webhook's own (``local_client``: its in-cluster identity or the
operator's kubeconfig) and a workload cluster reached through a kubeconfig a tenant may have
written (``client_from_kubeconfig``). A tenant's kubeconfig is data: only inline credentials are
accepted (:func:`check_inline_kubeconfig`), so building the client never runs a program or reads
a local file, and such a client is *untrusted*: its errors carry the HTTP status only, never the
remote server's text, so nothing a tenant's server says reaches an answer, a log line or an Event.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

# Kubernetes' own version priority (k8s.io/apimachinery version.CompareKubeAwareVersionStrings).
_STABILITY = {"": 3, "beta": 2, "alpha": 1}


def version_priority(version: str) -> tuple[int, int, int]:
    """Sort key: v1 > v1beta2 > v1beta1 > v1alpha1."""
    body = version.removeprefix("v")
    for stage in ("beta", "alpha"):
        if stage in body:
            major, _, minor = body.partition(stage)
            return _STABILITY[stage], int(major or 0), int(minor or 0)
    return _STABILITY[""], int(body or 0), 0


class KubeError(Exception):
    """A failed API call, with the status code and the server's own message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_status(cls, code: int, http_reason: str, body: bytes | str | None) -> KubeError:
        """From an HTTP error: the Kubernetes ``Status`` body says more than the status line."""
        message = reason = http_reason or ""
        try:
            status = json.loads(body or b"{}")
            message = status.get("message") or message
            reason = status.get("reason") or reason
        except (ValueError, AttributeError):
            pass
        return cls(code, reason, message)

    @classmethod
    def from_api_exception(cls, exc: ApiException) -> KubeError:
        return cls.from_status(exc.status or 0, exc.reason or "", exc.body)

    @classmethod
    def status_only(cls, code: int, cluster: str) -> KubeError:
        """An error from an untrusted cluster: its status code and the standard phrase, none of its text."""
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Error"
        return cls(code, phrase, f"the API server of cluster {cluster} answered {code} {phrase}")


@dataclass(frozen=True, slots=True)
class ResourcePath:
    """Where a resource lives: ``/api/v1`` or ``/apis/<group>/<version>``, plus its plural."""

    group: str
    version: str
    plural: str

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection(self, namespace: str | None = None) -> str:
        if namespace:
            return f"{self.prefix}/namespaces/{quote(namespace)}/{self.plural}"
        return f"{self.prefix}/{self.plural}"

    def item(self, namespace: str, name: str, subresource: str = "") -> str:
        path = f"{self.collection(namespace)}/{quote(name)}"
        return f"{path}/{subresource}" if subresource else path


class KubeClient:
    """Raw-path access to one cluster. Thread-safe; the connection pool is shared.

    ``trusted`` is False for a cluster reached through a tenant's kubeconfig: its errors then say
    only the status code (:meth:`error`)."""

    DISCOVERY_TTL_SECONDS = 60.0

    def __init__(self, api_client: k8s.ApiClient, name: str = "local", trusted: bool = True) -> None:
        self.api_client = api_client
        self.name = name
        self.trusted = trusted
        self._discovery: dict[str, tuple[float, list[str]]] = {}
        self._lock = threading.Lock()

    def _send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: Any,
        content_type: str | None,
        timeout: float | tuple[float, float] | None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.api_client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            return self.api_client.call_api(method, url, headers, body, _request_timeout=timeout)
        except urllib3.exceptions.HTTPError as exc:
            cause = _root_cause(exc) if self.trusted else "the connection failed"
            raise KubeError(0, "Unreachable", f"cannot reach the API server of cluster {self.name}: {cause}") from None

    def error(self, code: int, reason: str, body: bytes | str | None) -> KubeError:
        """The error for an HTTP failure of this cluster: with its Status message when trusted, else its code only."""
        if not self.trusted:
            return KubeError.status_only(code, self.name)
        return KubeError.from_status(code, reason, body)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] | None = 10.0,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """One call; returns the decoded JSON body or raises :class:`KubeError`.

        With ``warnings``, the API server's ``Warning`` headers (an admission webhook's warnings,
        a deprecated API) are appended to it, success or failure."""
        response = self._send(method, path, query, body, content_type, timeout)
        if warnings is not None and self.trusted:
            warnings.extend(warning_texts(response.headers.getlist("Warning")))
        try:
            data = response.read()
        except urllib3.exceptions.HTTPError as exc:
            cause = _root_cause(exc) if self.trusted else "the connection failed"
            raise KubeError(0, "Unreachable", f"connection to cluster {self.name} broke: {cause}") from None
        if not 200 <= response.status <= 299:
            raise self.error(response.status, response.reason, data)
        return json.loads(data) if data else {}

    def stream(self, path: str, query: list[tuple[str, str]], timeout: tuple[float, float]) -> Any:
        """Open a streaming GET (a watch); returns the urllib3 response for ``Watch.stream``."""
        response = self._send("GET", path, query, None, None, timeout)
        if not 200 <= response.status <= 299:
            raise self.error(response.status, response.reason, response.read())
        return response.response

    def served_versions(self, group: str) -> list[str]:
        """Versions of ``group`` this cluster serves, newest first ([] if the group is absent)."""
        now = time.monotonic()
        with self._lock:
            cached = self._discovery.get(group)
        if cached and now - cached[0] < self.DISCOVERY_TTL_SECONDS:
            return cached[1]
        try:
            doc = self.request("GET", f"/apis/{group}")
            versions = [v["version"] for v in doc.get("versions", []) if isinstance(v, dict) and "version" in v]
        except KubeError as exc:
            if exc.status != 404:
                raise
            versions = []
        versions.sort(key=version_priority, reverse=True)
        with self._lock:
            self._discovery[group] = (now, versions)
        return versions

    def forget_discovery(self, group: str) -> None:
        with self._lock:
            self._discovery.pop(group, None)

    def resource(self, group: str, plural: str, supported: tuple[str, ...]) -> ResourcePath:
        """The newest version of ``group`` that is both served and in ``supported``."""
        served = self.served_versions(group)
        for version in served:
            if version in supported:
                return ResourcePath(group, version, plural)
        raise KubeError(
            404,
            "NotFound",
            f"cluster {self.name} serves no supported version of {plural}.{group} "
            f"(served: {', '.join(served) or 'none'}; supported: {', '.join(supported)})",
        )

    def close(self) -> None:
        self.api_client.close()


_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def warning_texts(headers: list[str]) -> list[str]:
    """The texts of ``Warning`` headers (``299 - "text"``, RFC 7234), unescaped; one header may hold several."""
    return [re.sub(r"\\(.)", r"\1", m.group(1)) for header in headers for m in _WARNING.finditer(header)]


def _root_cause(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    while isinstance(reason, BaseException) and getattr(reason, "reason", None) is not None:
        reason = getattr(reason, "reason", None)
    return str(reason or exc)


def _named(api_client: k8s.ApiClient, user_agent: str) -> k8s.ApiClient:
    """Say who calls: API server audit logs (and the test emulator) attribute calls by User-Agent."""
    api_client.user_agent = user_agent
    return api_client


class KubeConfigError(ValueError):
    """The webhook's own cluster configuration cannot be loaded; the message says which and why."""


def local_client(kubeconfig: str | None = None, user_agent: str = "slime") -> KubeClient:
    """The webhook's own cluster: an explicit kubeconfig, else in-cluster, else ~/.kube/config."""
    source = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster configuration"
    try:
        if kubeconfig:
            for path in kubeconfig.split(os.pathsep):  # KUBECONFIG may list several files, like kubectl's
                with open(os.path.expanduser(path), "rb") as fh:
                    if not isinstance(yaml.load(fh, Loader=yaml.CSafeLoader), dict):
                        raise ValueError(f"{path} is not a kubeconfig (its YAML is not a map)")
            return KubeClient(_named(k8s_config.new_client_from_config(config_file=kubeconfig), user_agent), "local")
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            return KubeClient(_named(k8s.ApiClient(configuration), user_agent), "local")
        source = "~/.kube/config (no --kubeconfig and not in a cluster)"
        return KubeClient(_named(k8s_config.new_client_from_config(), user_agent), "local")
    except (
        k8s_config.ConfigException,
        yaml.YAMLError,
        OSError,
        TypeError,
        AttributeError,
        KeyError,
        ValueError,
    ) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KubeConfigError(f"{source} is not usable: {reason}") from None


# What a kubeconfig read from a Secret may hold: the server, its CA and inline credentials, as
# Cluster API writes them. Everything else is refused by name: `exec` and `auth-provider` run or
# load code, `tokenFile`, `certificate-authority`, `client-certificate` and `client-key` read local
# files (the webhook's own ServiceAccount token among them), `proxy-url` sends the webhook's
# traffic elsewhere, `insecure-skip-tls-verify` trusts whoever answers.
_KUBECONFIG_FIELDS = {
    "": {"apiVersion", "kind", "clusters", "contexts", "users", "current-context", "preferences", "extensions"},
    "clusters[].cluster": {"server", "certificate-authority-data", "tls-server-name", "extensions"},
    "users[].user": {"token", "client-certificate-data", "client-key-data", "extensions"},
    "contexts[].context": {"cluster", "user", "namespace", "extensions"},
}
_KUBECONFIG_LISTS = {"clusters": "cluster", "users": "user", "contexts": "context"}


class KubeconfigRefused(ValueError):
    """A kubeconfig from a Secret holds a field SliMe never uses (it could run a program or read a file)."""


def check_inline_kubeconfig(document: Any) -> None:
    """Raise :class:`KubeconfigRefused` naming the first field outside the inline-credential allow-list.

    The allow-list, not a deny-list: a field added to kubeconfig later is refused until it is known to be data."""
    if not isinstance(document, dict):
        raise KubeconfigRefused("it is not a kubeconfig document (a YAML map)")
    for key in document:
        if key not in _KUBECONFIG_FIELDS[""]:
            raise KubeconfigRefused(f"field {str(key)[:64]!r} is not allowed")
    for list_key, item_key in _KUBECONFIG_LISTS.items():
        entries = document.get(list_key) or []
        if not isinstance(entries, list):
            raise KubeconfigRefused(f"{list_key} is not a list")
        allowed = _KUBECONFIG_FIELDS[f"{list_key}[].{item_key}"]
        for index, entry in enumerate(entries):
            body = entry.get(item_key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                raise KubeconfigRefused(f"{list_key}[{index}] has no {item_key} map")
            for key in body:
                if key not in allowed:
                    raise KubeconfigRefused(f"{list_key}[{index}].{item_key}.{str(key)[:64]} is not allowed")
            server = body.get("server") if item_key == "cluster" else None
            if server is not None and not (isinstance(server, str) and server.startswith("https://")):
                raise KubeconfigRefused(f"{list_key}[{index}].cluster.server is not an https:// URL")


def client_from_kubeconfig(data: bytes, name: str, user_agent: str = "slime") -> KubeClient:
    """A workload cluster, from the bytes of a CAPI ``<cluster>-kubeconfig`` Secret: inline credentials only,
    and an untrusted client (its errors never carry the remote server's text)."""
    try:
        document = yaml.load(data, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        raise KubeError(0, "InvalidKubeconfig", f"kubeconfig for cluster {name} is not YAML") from None
    try:
        check_inline_kubeconfig(document)
    except KubeconfigRefused as exc:
        raise KubeError(
            0,
            "InvalidKubeconfig",
            f"kubeconfig for cluster {name} refused: {exc} (only server, certificate-authority-data and inline "
            "credentials are accepted: token, client-certificate-data, client-key-data)",
        ) from None
    try:
        api_client = k8s_config.new_client_from_config_dict(document, persist_config=False)
        return KubeClient(_named(api_client, user_agent), name, trusted=False)
    except (ValueError, KeyError, TypeError, k8s_config.ConfigException) as exc:
        raise KubeError(
            0, "InvalidKubeconfig", f"kubeconfig for cluster {name} is not usable: {type(exc).__name__}"
        ) from None
