"""Does a webhook configuration's caBundle verify the certificate its webhook serves?

kube-apiserver calls a ``service`` webhook over TLS, checks the chain against ``caBundle`` and
the name ``<service>.<namespace>.svc``. :func:`probe` does the same over the network, dialling
where kube-apiserver would: an ``ExternalName`` Service at its external name, any other Service
at ``<service>.<namespace>.svc`` (cluster DNS: it resolves inside the cluster only, so an
operator's machine falls back to the serving certificate in the webhook's TLS Secret, checked by
:func:`verify` without a connection). A Service's ClusterIP is never dialled directly.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature

EXPIRY_WARNING = dt.timedelta(days=7)


class NotReachable(Exception):
    """The webhook's address does not resolve or answer from here; the message says which."""


@dataclass(frozen=True)
class Served:
    """A certificate the bundle verified: when it expires."""

    not_after: dt.datetime
    subject: str


def load_bundle(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a caBundle; ValueError when it holds none."""
    return x509.load_pem_x509_certificates(pem)


def verify(chain_pem: bytes, bundle_pem: bytes, server_name: str, now: dt.datetime | None = None) -> Served:
    """Check a serving chain (``tls.crt``) against the bundle as a TLS client would; ValueError says what fails.

    The leaf must name ``server_name`` (a DNS SAN), be valid now, and chain, through the
    intermediates in the file, to a certificate of the bundle.
    """
    now = now or dt.datetime.now(dt.UTC)
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError:
        raise ValueError("the serving certificate is not PEM") from None
    try:
        roots = load_bundle(bundle_pem)
    except ValueError:
        raise ValueError("the caBundle holds no PEM certificate") from None
    leaf = chain[0]
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except x509.ExtensionNotFound:
        names = []
    if server_name not in names:
        raise ValueError(
            f"the serving certificate does not name {server_name} (its DNS names: {', '.join(names) or 'none'})"
        )
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise ValueError(
            f"the serving certificate is not valid now (valid {leaf.not_valid_before_utc} to "
            f"{leaf.not_valid_after_utc})"
        )
    current, pool = leaf, chain[1:]
    for _ in range(len(chain) + 1):
        for root in roots:
            if _issued_by(current, root):
                return Served(leaf.not_valid_after_utc, leaf.subject.rfc4514_string())
        parent = next((c for c in pool if _issued_by(current, c)), None)
        if parent is None:
            break
        current = parent
    raise ValueError("the caBundle does not verify the serving certificate (signed by another CA)")


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def probe(host: str, port: int, server_name: str, bundle_pem: bytes, timeout: float = 5.0) -> Served:
    """TLS to ``host:port`` as kube-apiserver connects: the bundle must verify the chain and the name.

    :class:`NotReachable` when the address does not resolve or nothing answers; ValueError when the
    certificate does not verify. A webhook that requires client certificates (``admissionAuth``)
    still shows its certificate: the client checks the server's before it is asked for its own.
    """
    try:
        context = ssl.create_default_context(cadata=bundle_pem.decode("ascii", errors="replace"))
    except ssl.SSLError:
        raise ValueError("the caBundle holds no PEM certificate") from None
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise NotReachable(f"{host}:{port}: {exc.strerror or exc}") from None
    with sock:
        try:
            with context.wrap_socket(sock, server_hostname=server_name) as tls:
                der = tls.getpeercert(binary_form=True)
        except ssl.SSLCertVerificationError as exc:
            raise ValueError(
                f"the caBundle does not verify the certificate served at {host}:{port}: {exc.verify_message}"
            ) from None
        except (ssl.SSLError, OSError) as exc:
            raise NotReachable(f"TLS handshake with {host}:{port} failed: {exc}") from None
    if der is None:
        raise NotReachable(f"{host}:{port} sent no certificate")
    leaf = x509.load_der_x509_certificate(der)
    return Served(leaf.not_valid_after_utc, leaf.subject.rfc4514_string())
