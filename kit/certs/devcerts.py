"""Development PKI: a CA and serving certificates signed by it, written as PEM files.

The tests, the local run and the demo use it to serve TLS the way a cluster would: the client
trusts only the CA bundle, exactly as kube-apiserver trusts a webhook configuration's caBundle.
ECDSA P-256 keeps generation fast enough to rotate certificates many times in a test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.version import version_line


@dataclass(frozen=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_file: Path

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_private(path: Path, data: bytes) -> None:
    """Write a key readable by its owner only, replacing any old file atomically."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def create_ca(out_dir: Path, common_name: str = "slime-dev-ca", days: int = 365) -> CertificateAuthority:
    out_dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file = out_dir / "ca.crt"
    _write_public(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        out_dir / "ca.key",
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return CertificateAuthority(cert, key, cert_file)


def issue_serving_cert(
    ca: CertificateAuthority,
    cert_file: Path,
    key_file: Path,
    dns_names: list[str],
    ip_addresses: list[str],
    days: int = 30,
) -> x509.Certificate:
    """Sign a serverAuth certificate for the given names and write the pair (key first)."""
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if not sans:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    return _issue_leaf(
        ca,
        cert_file,
        key_file,
        _name(dns_names[0] if dns_names else ip_addresses[0]),
        ExtendedKeyUsageOID.SERVER_AUTH,
        days,
        x509.SubjectAlternativeName(sans),
    )


def issue_client_cert(
    ca: CertificateAuthority, cert_file: Path, key_file: Path, common_name: str, organization: str = "", days: int = 30
) -> x509.Certificate:
    """Sign a clientAuth certificate (what kube-apiserver presents to a webhook) and write the pair."""
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return _issue_leaf(ca, cert_file, key_file, x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH, days)


def _issue_leaf(
    ca: CertificateAuthority,
    cert_file: Path,
    key_file: Path,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    days: int,
    sans: x509.SubjectAlternativeName | None = None,
) -> x509.Certificate:
    """Sign a leaf certificate for one extended key usage with a fresh P-256 key; write key, then certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=days))
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    cert_file.parent.mkdir(parents=True, exist_ok=True)
    _write_private(
        key_file,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    _write_public(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return cert


def write_dev_pki(out_dir: Path, dns_names: list[str], ip_addresses: list[str]) -> CertificateAuthority:
    """A CA plus ``tls.crt``/``tls.key`` for the given names, as a cert-manager Secret would hold."""
    ca = create_ca(out_dir)
    issue_serving_cert(ca, out_dir / "tls.crt", out_dir / "tls.key", dns_names, ip_addresses)
    return ca


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="slime-dev-certs",
        description="Write a development CA (ca.crt, ca.key) and a serving pair (tls.crt, tls.key).",
    )
    parser.add_argument("--out", type=Path, default=Path("dev-certs"), help="output directory (default: dev-certs)")
    parser.add_argument("--dns", action="append", default=[], help="DNS name (repeatable; default: localhost)")
    parser.add_argument("--ip", action="append", default=[], help="IP address (repeatable; default: 127.0.0.1)")
    parser.add_argument("--version", action="version", version=version_line("slime-dev-certs"))
    args = parser.parse_args(argv)
    # Each list has its own default, so `--dns localhost` still covers https://127.0.0.1 too.
    dns = args.dns or ["localhost"]
    ips = args.ip or ["127.0.0.1"]
    try:
        write_dev_pki(args.out, dns, ips)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote {args.out}/ca.crt, {args.out}/tls.crt, {args.out}/tls.key for {', '.join(dns + ips)}")


if __name__ == "__main__":
    main()
