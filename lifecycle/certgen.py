"""``slime-certgen``: the webhooks' certificates, made once in the cluster and kept, in the manner of ingress-nginx's
kube-webhook-certgen.

Without cert-manager the chart (``selfSignedTLS.generator: job``) renders no key and no
certificate: two hook Jobs run this command from the product image instead.

- ``create`` (pre-install, pre-upgrade): a CA in its own Secret (``--ca-secret``, read by this
  Job only), and a serving pair signed by it in each webhook's TLS Secret (``--serving
  SECRET=HOST,...``: ``tls.crt``, ``tls.key``, ``ca.crt``), and with ``--client`` the certificate
  kube-apiserver presents (``admissionAuth``). What exists and is valid is **kept**: a pair for
  the right host names, issued by the CA, with the CA bundle, and more than ``--renew-days`` from
  expiry. A serving pair near expiry is renewed under the same CA (its key is kept for that), so
  the webhook configurations' ``caBundle`` never changes for it; a CA near expiry is replaced,
  and the old one stays in the bundle until it expires, so a pod that still serves an older
  pair is trusted while the kubelet brings it the new one. The client certificate is never
  renewed here: kube-apiserver holds a copy, so a renewal is yours to make (delete the Secret,
  upgrade, copy it to the control plane); one near expiry is reported.
- ``patch`` (post-install, post-upgrade): each webhook configuration's ``caBundle`` set to its
  Secret's ``ca.crt`` (``--webhook mutating|validating/NAME=SECRET``), with a resourceVersion
  precondition; nothing is written when it is already right. Given the options of ``create``
  too (the chart gives them), it first makes or keeps the Secrets exactly as ``create`` does:
  on the upgrade from ``selfSignedTLS.generator: helm``, Helm deletes the Secrets it rendered
  before (they left its manifest) after the pre-upgrade Job kept them, and this makes them again
  under the same CA.

So ``helm template`` renders the same manifest every time and a GitOps sync never changes a
certificate. Keys never appear in a log line or an error. Exit 0 when done, 1 when the API
refused (the Job retries), 2 on a bad flag.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.kube import KubeClient, KubeConfigError, KubeError, ResourcePath, local_client
from common.logs import configure_logging
from common.names import TLS_SOURCE_ANNOTATION
from common.version import build_info, version_line

PROG = "slime-certgen"
SOURCE = "slime-certgen"  # the value of the slime/tls-source annotation on what it writes
SECRETS = ResourcePath("", "v1", "secrets")
CONFIGURATIONS = {
    "mutating": ResourcePath("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"),
    "validating": ResourcePath("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"),
}
log = logging.getLogger("slime.certgen")


class UsageError(Exception):
    pass


# --- certificates ------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(subject: str, issuer: x509.Name, public: Any, days: int) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject[:64])]))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def new(cls, name: str, days: int) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])])
        cert = (
            _builder(name, subject, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def issue(self, name: str, days: int, hosts: Sequence[str] = (), client: bool = False) -> tuple[bytes, bytes]:
        """A leaf pair (PEM certificate, PEM key): a server certificate for ``hosts``, or a client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            _builder(name, self.cert.subject, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), False)
        return _pem(builder.sign(self.key, hashes.SHA256())), _key_pem(key)


def _load_pair(cert_pem: bytes, key_pem: bytes) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The pair, or None when it does not parse or the key is not the certificate's."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return None
    return cert, key


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _remaining(cert: x509.Certificate) -> dt.timedelta:
    return cert.not_valid_after_utc - _now()


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _hosts(cert: x509.Certificate) -> set[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(names.get_values_for_type(x509.DNSName))


# --- Secrets -----------------------------------------------------------------------------------


@dataclass
class Store:
    kube: KubeClient
    namespace: str
    labels: dict[str, str]

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.request("GET", SECRETS.item(self.namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    @staticmethod
    def data(secret: dict[str, Any] | None, key: str) -> bytes:
        value = ((secret or {}).get("data") or {}).get(key) or ""
        try:
            return base64.b64decode(value)
        except ValueError:
            return b""

    def write(self, name: str, existing: dict[str, Any] | None, data: dict[str, bytes], kind: str) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": kind,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {**((existing or {}).get("metadata", {}).get("labels") or {}), **self.labels},
                "annotations": {
                    **((existing or {}).get("metadata", {}).get("annotations") or {}),
                    TLS_SOURCE_ANNOTATION: SOURCE,
                },
            },
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        if existing is None:
            self.kube.request("POST", SECRETS.collection(self.namespace), body=body)
        elif existing.get("type", kind) != kind:
            # The type of a Secret cannot change: replace it (a Secret of the same name left by someone else).
            self.kube.request("DELETE", SECRETS.item(self.namespace, name))
            self.kube.request("POST", SECRETS.collection(self.namespace), body=body)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            self.kube.request("PUT", SECRETS.item(self.namespace, name), body=body)


@dataclass(frozen=True)
class Plan:
    ca_days: int
    cert_days: int
    renew: dt.timedelta


def ensure_ca(store: Store, name: str, plan: Plan) -> tuple[Authority, bytes]:
    """The CA (kept while valid and not near expiry) and the bundle webhooks are trusted with."""
    secret = store.read(name)
    pair = _load_pair(store.data(secret, "tls.crt"), store.data(secret, "tls.key")) if secret else None
    if pair is not None and pair[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
        cert, key = pair
        if _remaining(cert) > plan.renew:
            bundle = store.data(secret, "ca.crt")
            if _pem(cert) in bundle:
                log.info(
                    "CA kept", extra={"secret": f"{store.namespace}/{name}", "notAfter": str(cert.not_valid_after_utc)}
                )
                return Authority(cert, key), bundle
    previous = [c for c in _certificates(store.data(secret, "ca.crt")) if _remaining(c) > dt.timedelta(0)]
    if pair is not None and _remaining(pair[0]) > dt.timedelta(0) and _pem(pair[0]) not in map(_pem, previous):
        previous.insert(0, pair[0])
    authority = Authority.new(f"{name}-{_now():%Y%m%d%H%M%S}", plan.ca_days)
    # The new CA first; the previous ones stay trusted until they expire (pods may still serve their pairs).
    bundle = b"".join([_pem(authority.cert), *(_pem(c) for c in previous if c != authority.cert)])
    store.write(
        name,
        secret,
        {"tls.crt": _pem(authority.cert), "tls.key": _key_pem(authority.key), "ca.crt": bundle},
        "kubernetes.io/tls",
    )
    log.info(
        "CA created" if secret is None else "CA renewed",
        extra={"secret": f"{store.namespace}/{name}", "notAfter": str(authority.cert.not_valid_after_utc)},
    )
    return authority, bundle


def ensure_serving(store: Store, name: str, hosts: list[str], ca: Authority, bundle: bytes, plan: Plan) -> str:
    """The webhook's serving Secret: kept when valid for ``hosts`` under ``ca``; returns what was done."""
    secret = store.read(name)
    pair = _load_pair(store.data(secret, "tls.crt"), store.data(secret, "tls.key")) if secret else None
    if pair is not None:
        cert, _ = pair
        valid = (
            set(hosts) <= _hosts(cert)
            and _issued_by(cert, ca.cert)
            and _remaining(cert) > plan.renew
            and cert.not_valid_before_utc <= _now()
        )
        if valid:
            if store.data(secret, "ca.crt") == bundle:
                outcome = "kept"
            else:
                data = {k: store.data(secret, k) for k in ("tls.crt", "tls.key")}
                store.write(name, secret, {**data, "ca.crt": bundle}, "kubernetes.io/tls")
                outcome = "kept, CA bundle updated"
            log.info(f"serving certificate {outcome}", extra={"secret": f"{store.namespace}/{name}"})
            return outcome
    cert_pem, key_pem = ca.issue(hosts[0], plan.cert_days, hosts)
    store.write(name, secret, {"tls.crt": cert_pem, "tls.key": key_pem, "ca.crt": bundle}, "kubernetes.io/tls")
    outcome = "created" if secret is None else "renewed"
    log.info(f"serving certificate {outcome}", extra={"secret": f"{store.namespace}/{name}", "hosts": hosts})
    return outcome


def ensure_client(store: Store, name: str, common_name: str, plan: Plan) -> str:
    """kube-apiserver's client certificate (admissionAuth): made once, with a client CA of its own; never renewed."""
    secret = store.read(name)
    pair = _load_pair(store.data(secret, "tls.crt"), store.data(secret, "tls.key")) if secret else None
    cas = _certificates(store.data(secret, "ca.crt"))
    if (
        pair is not None
        and cas
        and any(_issued_by(pair[0], ca) for ca in cas)
        and _remaining(pair[0]) > dt.timedelta(0)
    ):
        if _remaining(pair[0]) <= plan.renew:
            log.warning(
                "the client certificate kube-apiserver presents expires soon: delete the Secret, upgrade, and give "
                "kube-apiserver the new one (docs/install.md, Authenticated admission)",
                extra={"secret": f"{store.namespace}/{name}", "notAfter": str(pair[0].not_valid_after_utc)},
            )
        else:
            log.info("client certificate kept", extra={"secret": f"{store.namespace}/{name}"})
        return "kept"
    ca = Authority.new(f"{common_name}-ca", plan.ca_days)
    cert_pem, key_pem = ca.issue(common_name, plan.cert_days, client=True)
    store.write(name, secret, {"tls.crt": cert_pem, "tls.key": key_pem, "ca.crt": _pem(ca.cert)}, "kubernetes.io/tls")
    outcome = "created" if secret is None else "replaced (it was not a valid pair)"
    log.info(f"client certificate {outcome}", extra={"secret": f"{store.namespace}/{name}"})
    return outcome


# --- webhook configurations --------------------------------------------------------------------


def patch_bundle(kube: KubeClient, kind: str, name: str, bundle: bytes) -> bool:
    """Set every webhook's caBundle of the configuration to ``bundle``; True when something was written."""
    path = CONFIGURATIONS[kind].item("", name)
    encoded = base64.b64encode(bundle).decode()
    for _ in range(3):
        config = kube.request("GET", path)
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": config["metadata"]["resourceVersion"]}
        ]
        for index, hook in enumerate(config.get("webhooks") or []):
            if (hook.get("clientConfig") or {}).get("caBundle") != encoded:
                ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
        if len(ops) == 1:
            return False
        try:
            kube.request("PATCH", path, body=ops, content_type="application/json-patch+json")
            return True
        except KubeError as exc:
            if exc.status not in (409, 422):  # a write between our read and our patch: read again
                raise
    raise KubeError(409, "Conflict", f"{kind} webhook configuration {name} kept changing under the patch")


# --- command line ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    command = _Parser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else "")
    command.add_argument("--version", action="version", version=version_line(PROG))
    common = _Parser(add_help=False)
    common.add_argument("--namespace", required=True, help="the release namespace, where the Secrets live")
    common.add_argument("--kubeconfig", help="kubeconfig [env KUBECONFIG; default: in-cluster]")
    sub = command.add_subparsers(dest="step", required=True, parser_class=_Parser)
    create = sub.add_parser("create", parents=[common], help="make or keep the CA and the certificate Secrets")
    _secrets_options(create, required=True)
    patch = sub.add_parser(
        "patch",
        parents=[common],
        help="set the webhook configurations' caBundle; with the create options, make or keep the Secrets first",
    )
    patch.add_argument("--webhook", action="append", required=True, metavar="mutating|validating/NAME=SECRET")
    _secrets_options(patch, required=False)
    return command


def _secrets_options(command: argparse.ArgumentParser, required: bool) -> None:
    command.add_argument(
        "--ca-secret", required=required, help="Secret holding the CA (its key is read by this Job only)"
    )
    command.add_argument("--serving", action="append", default=[], metavar="SECRET=HOST[,HOST...]", required=required)
    command.add_argument("--client", metavar="SECRET=COMMON_NAME", help="kube-apiserver's client certificate")
    command.add_argument("--ca-days", type=int, default=3650)
    command.add_argument("--cert-days", type=int, default=3650)
    command.add_argument("--renew-days", type=int, default=30, help="renew what expires within this many days")
    command.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label the Secrets")


def _pairs(items: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        left, equals, right = item.partition("=")
        if not equals or not left or not right:
            raise UsageError(f"{flag}: {item!r} is not NAME=VALUE")
        out.append((left, right))
    return out


def run(argv: Sequence[str] | None = None) -> int:
    try:
        options = parser().parse_args(argv)
        configure_logging("INFO")
        log.info("starting", extra={"service": PROG, "step": options.step, **build_info()})
        kube = local_client(options.kubeconfig, user_agent=PROG)
    except (UsageError, KubeConfigError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        if options.step == "patch" and bool(options.ca_secret) != bool(options.serving):
            raise UsageError(
                "patch: give --ca-secret and --serving together (to make or keep the Secrets first), or neither"
            )
        if options.ca_secret:
            if min(options.ca_days, options.cert_days) <= options.renew_days or options.renew_days < 0:
                raise UsageError("--ca-days and --cert-days must be more than --renew-days (>= 0)")
            serving = [(secret, hosts.split(",")) for secret, hosts in _pairs(options.serving, "--serving")]
            store = Store(kube, options.namespace, dict(_pairs(options.label, "--label")))
            plan = Plan(options.ca_days, options.cert_days, dt.timedelta(days=options.renew_days))
            authority, bundle = ensure_ca(store, options.ca_secret, plan)
            for secret, hosts in serving:
                ensure_serving(store, secret, hosts, authority, bundle, plan)
            if options.client:
                ((secret, name),) = _pairs([options.client], "--client")
                ensure_client(store, secret, name, plan)
        if options.step == "patch":
            for target, secret_name in _pairs(options.webhook, "--webhook"):
                kind, slash, name = target.partition("/")
                if kind not in CONFIGURATIONS or not slash or not name:
                    raise UsageError(f"--webhook: {target!r} is not mutating/<name> or validating/<name>")
                stored = Store(kube, options.namespace, {}).read(secret_name)
                bundle = Store.data(stored, "ca.crt")
                if not _certificates(bundle):
                    raise KubeError(404, "NotFound", f"Secret {options.namespace}/{secret_name} holds no ca.crt")
                changed = patch_bundle(kube, kind, name, bundle)
                log.info(
                    "caBundle set" if changed else "caBundle already right",
                    extra={"configuration": f"{kind}/{name}", "secret": f"{options.namespace}/{secret_name}"},
                )
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except KubeError as exc:
        log.error("the API server refused", extra={"error": str(exc)})
        return 1
    finally:
        kube.close()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
