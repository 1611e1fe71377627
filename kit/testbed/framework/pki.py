"""Certificates for the kit: an in-memory CA that issues PEM pairs, and a per-test PKI on disk, rotatable in place.

- :class:`Ca`: a CA of the kit's own (the real control plane's, its front proxy's, KEDA's, a
  manager's webhook server's): ECDSA P-256, serving and client certificates as PEM bytes.
- :class:`Pki`: a CA bundle plus a serving pair for 127.0.0.1 in a directory, as a webhook
  serves it in the fast suite; :meth:`Pki.issue` renews the pair as cert-manager would.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.devcerts import CertificateAuthority, create_ca, issue_serving_cert

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def pem_key(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write(path: Path, data: bytes, private: bool = False) -> Path:
    """Write ``data`` to ``path`` (mode 0600 when ``private``: keys, kubeconfigs); the path."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True)
class Ca:
    """A CA in memory; :meth:`issue` signs PEM pairs (30 days) with it."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str) -> Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5))
            .not_valid_after(_now() + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @property
    def pem(self) -> bytes:
        return pem_cert(self.cert)

    def issue(
        self,
        common_name: str,
        organization: str = "",
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client_too: bool = False,
    ) -> tuple[bytes, bytes]:
        """A (certificate, key) PEM pair: a client certificate, or a serving one with SANs (``client_too``: both)."""
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        if client_too or not server:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5))
            .not_valid_after(_now() + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if dns or ips:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return pem_cert(builder.sign(self.key, hashes.SHA256())), pem_key(key)


def write_pair(directory: Path, name: str, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    """Write a (certificate, key) ``pair`` as ``<name>.crt`` and ``<name>.key`` (the key private) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return write(directory / f"{name}.crt", pair[0]), write(directory / f"{name}.key", pair[1], private=True)


# --- the fast suite's PKI on disk -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingPair:
    """A serving certificate and key, and the CA bundle that verifies them."""

    cert_file: Path
    key_file: Path
    ca_file: Path


@dataclass
class Pki:
    """A dev CA and a serving pair for localhost and 127.0.0.1 in ``directory``."""

    directory: Path
    ca: CertificateAuthority

    @property
    def ca_file(self) -> Path:
        return self.ca.cert_file

    @property
    def cert_file(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.directory / "tls.key"

    def issue(self) -> x509.Certificate:
        """(Re)issue the serving pair, as cert-manager does on renewal."""
        return issue_serving_cert(self.ca, self.cert_file, self.key_file, ["localhost"], ["127.0.0.1"])

    def server_context(self) -> ssl.SSLContext:
        """A TLS server context with the serving pair (for a stand-in that serves https)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def make_pki(directory: Path) -> Pki:
    pki = Pki(directory, create_ca(directory))
    pki.issue()
    return pki
