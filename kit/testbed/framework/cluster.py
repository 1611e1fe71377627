"""One client for any Kubernetes API server, kubemu or kube-apiserver: built from a kubeconfig or credentials.

- :class:`Credentials`: where an API server is and who calls it (a CA to trust, a client
  certificate, or a bearer token); read from a kubeconfig or written to one.
- :class:`KubeClient`: the kit's one HTTP client of the Kubernetes API (as Cluster API's
  ``ClusterProxy`` is its test framework's): objects by apiVersion and kind (or plural), raw
  calls, TokenRequests; as another user (``Impersonate-User``) or as a ServiceAccount (its token).
- :class:`Cluster`: what the seeding functions of :mod:`testbed.framework.world` need of a cluster.
  :class:`KubeClient` is one; kubemu's ``Emulator`` is another (its direct store access keeps a
  seeded ``status``).

A created object's ``status`` is written afterwards through ``/status``, as the controller that
owns it would (kubelet for a pod's ``hostIP``, CAPI for a MachineDeployment's selector): a real
API server ignores ``status`` on create.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml

from testbed.framework.errors import ApiCallFailed
from testbed.framework.pki import write
from testbed.framework.wait import wait_for

Obj = dict[str, Any]
JSON, MERGE_PATCH = "application/json", "application/merge-patch+json"
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "Node",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "APIService",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ClusterIssuer",
    }
)
IDEMPOTENT = frozenset({"GET", "PUT", "DELETE", "HEAD"})


class Cluster(Protocol):
    """Create and read objects by apiVersion and kind (or plural): what seeding needs."""

    def create(self, obj: Obj, namespace: str | None = None) -> Obj: ...

    def get(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> Obj | None: ...

    def list(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]: ...


class MutableCluster(Cluster, Protocol):
    """A :class:`Cluster` that can also change objects."""

    def update(self, obj: Obj) -> Obj: ...

    def patch(self, api_version: str, kind_or_plural: str, namespace: str, name: str, patch: Obj) -> Obj: ...


def plural_of(kind_or_plural: str) -> str:
    """``Pod`` -> ``pods``, ``NetworkPolicy`` -> ``networkpolicies``; a plural (lower case) is kept."""
    if kind_or_plural[:1].islower():
        return kind_or_plural
    lower = kind_or_plural.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    if lower.endswith("ss"):
        return lower + "es"
    return lower if lower.endswith("s") else lower + "s"


def resource_path(api_version: str, kind_or_plural: str, namespace: str = "", name: str = "", sub: str = "") -> str:
    """The API path of a collection, an object or its subresource (a cluster-scoped kind ignores ``namespace``)."""
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    plural = plural_of(kind_or_plural)
    if namespace and kind_or_plural not in CLUSTER_SCOPED:
        path = f"{prefix}/namespaces/{namespace}/{plural}"
    else:
        path = f"{prefix}/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def _data(path: Path | None) -> str:
    return base64.b64encode(path.read_bytes()).decode() if path is not None else ""


@dataclass(frozen=True)
class Credentials:
    """Where an API server is (``url``) and who calls it: a client certificate, a bearer token, or nobody (kubemu)."""

    url: str
    ca_file: Path | None = None  # the CA that signed the server's certificate (https)
    cert_file: Path | None = None
    key_file: Path | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_kubeconfig(cls, path: Path | str) -> Credentials:
        """The current context of a kubeconfig; inline ``*-data`` is written to private files beside it."""
        path = Path(path)
        config = yaml.safe_load(path.read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next((u.get("user") or {} for u in config.get("users") or [] if u["name"] == context.get("user")), {})

        def file_of(key: str, suffix: str) -> Path | None:
            source = cluster if key == "certificate-authority" else user
            if source.get(key):
                return Path(source[key])
            if source.get(f"{key}-data"):
                data = base64.b64decode(source[f"{key}-data"])
                return write(path.with_name(f"{path.name}.{suffix}"), data, private=True)
            return None

        return cls(
            cluster["server"],
            file_of("certificate-authority", "ca.crt"),
            file_of("client-certificate", "client.crt"),
            file_of("client-key", "client.key"),
            user.get("token"),
        )

    def with_token(self, token: str) -> Credentials:
        """The same API server, called with a bearer token (a ServiceAccount's) instead."""
        return replace(self, cert_file=None, key_file=None, token=token)

    def kubeconfig(self, user: str = "kit") -> Obj:
        """A kubeconfig of these credentials, everything inline."""
        identity: Obj = {"token": self.token} if self.token else {}
        if self.cert_file is not None:
            identity = {"client-certificate-data": _data(self.cert_file), "client-key-data": _data(self.key_file)}
        server: Obj = {"server": self.url}
        if self.ca_file is not None:
            server["certificate-authority-data"] = _data(self.ca_file)
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": user, "user": identity}],
            "contexts": [{"name": user, "context": {"cluster": "cluster", "user": user}}],
            "current-context": user,
        }

    def write_kubeconfig(self, path: Path, user: str = "kit") -> Path:
        return write(path, yaml.safe_dump(self.kubeconfig(user)).encode(), private=True)


class KubeClient:
    """Calls to one API server over kept-alive connections, as ``credentials`` (or ``as_user``, impersonated)."""

    def __init__(
        self, credentials: Credentials, *, as_user: str | None = None, user_agent: str = "", timeout: float = 15.0
    ) -> None:
        self.credentials, self.user, self.user_agent, self.timeout = credentials, as_user, user_agent, timeout
        headers = {"User-Agent": user_agent} if user_agent else {}
        if credentials.token:
            headers["Authorization"] = f"Bearer {credentials.token}"
        if as_user:
            headers["Impersonate-User"] = as_user
        verify: ssl.SSLContext | bool = False
        if credentials.url.startswith("https:"):
            verify = ssl.create_default_context(cafile=str(credentials.ca_file) if credentials.ca_file else None)
            if credentials.cert_file is not None:
                verify.load_cert_chain(str(credentials.cert_file), str(credentials.key_file))
        self.http = httpx.Client(base_url=credentials.url, verify=verify, timeout=timeout, headers=headers)
        self._users: dict[str, KubeClient] = {}

    @classmethod
    def from_kubeconfig(cls, path: Path | str, **options: Any) -> KubeClient:
        return cls(Credentials.from_kubeconfig(path), **options)

    def as_user(self, name: str) -> KubeClient:
        """A client whose every call is made as ``name`` (the caller needs the ``impersonate`` verb); one per user,
        closed with this one."""
        if name not in self._users:
            self._users[name] = KubeClient(
                self.credentials, as_user=name, user_agent=self.user_agent, timeout=self.timeout
            )
        return self._users[name]

    def with_token(self, token: str, user_agent: str = "") -> KubeClient:
        """Another client calling with ``token`` (a ServiceAccount's own identity)."""
        return KubeClient(self.credentials.with_token(token), user_agent=user_agent, timeout=self.timeout)

    def close(self) -> None:
        for client in self._users.values():
            client.close()
        self.http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- calls

    def send(
        self, method: str, path: str, body: Any = None, content_type: str = JSON, timeout: float | None = None
    ) -> httpx.Response:
        """One call; its answer whatever its status. A call that cannot change anything twice is retried once when
        its connection broke (an API server restarted since the connection was made)."""
        headers = {"Content-Type": content_type} if body is not None else {}
        attempts = 2 if method in IDEMPOTENT else 1
        for attempt in range(attempts):
            try:
                return self.http.request(
                    method, path, json=body, headers=headers, timeout=timeout if timeout is not None else self.timeout
                )
            except httpx.TransportError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = JSON, timeout: float | None = None
    ) -> Any:
        """One call; its decoded answer, :class:`ApiCallFailed` for an error status."""
        answer = self.send(method, path, body, content_type, timeout)
        if answer.status_code >= 300:
            raise ApiCallFailed(method, path, answer.status_code, answer.text)
        return answer.json() if answer.content else None

    def ok(self, path: str) -> bool:
        """Whether ``GET path`` answers 200 (``/readyz``, an object, a discovery document)."""
        return self.send("GET", path, timeout=5).status_code == 200

    # -- objects

    def get(self, api_version: str, kind_or_plural: str, namespace: str, name: str, sub: str = "") -> Obj | None:
        """The object (or its subresource), None when it does not exist."""
        answer = self.send("GET", resource_path(api_version, kind_or_plural, namespace, name, sub))
        if answer.status_code == 404:
            return None
        if answer.status_code >= 300:
            raise ApiCallFailed("GET", str(answer.request.url), answer.status_code, answer.text)
        found: Obj = answer.json()
        return found

    def list(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        path = resource_path(api_version, kind_or_plural, namespace)
        answer = self.http.get(path, params=query)
        if answer.status_code >= 300:
            raise ApiCallFailed("GET", path, answer.status_code, answer.text)
        items: list[Obj] = answer.json().get("items") or []
        return items

    def create(self, obj: Obj, namespace: str | None = None) -> Obj:
        """POST ``obj`` (its ``status`` written after, through ``/status``). A namespace's ``default`` ServiceAccount
        appears a moment after the namespace (kube-controller-manager makes it): until then a create is retried."""
        namespace = namespace or obj["metadata"].get("namespace", "")
        path = resource_path(obj["apiVersion"], obj["kind"], namespace)
        body = {k: v for k, v in obj.items() if k != "status"}

        def created() -> Obj | None:
            try:
                answer: Obj = self.request("POST", path, body)
            except ApiCallFailed as exc:
                if 'serviceaccount "default" not found' in exc.body.replace('\\"', '"'):
                    return None
                raise
            return answer

        stored = wait_for(created, "api-object", f"the default ServiceAccount of namespace {namespace}")
        assert stored is not None
        if obj.get("status"):
            name = stored["metadata"]["name"]
            stored = self.patch(obj["apiVersion"], obj["kind"], namespace, name, {"status": obj["status"]}, "status")
        return stored

    def update(self, obj: Obj) -> Obj:
        """PUT the whole object, as controller-runtime's ``client.Update`` sends it."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        updated: Obj = self.request("PUT", path, obj)
        return updated

    def patch(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str = "",
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        path = resource_path(api_version, kind_or_plural, namespace, name, subresource)
        patched: Obj = self.request("PATCH", path, patch, content_type)
        return patched

    def delete(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> Obj | None:
        """DELETE; the answer (the object, or a Status), None when it did not exist."""
        answer = self.send("DELETE", resource_path(api_version, kind_or_plural, namespace, name))
        if answer.status_code == 404:
            return None
        if answer.status_code >= 300:
            raise ApiCallFailed("DELETE", str(answer.request.url), answer.status_code, answer.text)
        deleted: Obj | None = answer.json() if answer.content else None
        return deleted

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A ServiceAccount token from the TokenRequest API (what the kubelet projects into a pod)."""
        review = self.request(
            "POST",
            resource_path("v1", "serviceaccounts", namespace, service_account, "token"),
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        token: str = review["status"]["token"]
        return token

    def metrics(self) -> str:
        """The API server's ``/metrics`` page."""
        answer = self.send("GET", "/metrics")
        answer.raise_for_status()
        return answer.text
