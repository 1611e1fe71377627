"""A per-test PKI: CA bundle plus a serving pair for 127.0.0.1, rotatable in place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from certs.devcerts import CertificateAuthority, create_ca, issue_serving_cert


@dataclass(frozen=True)
class ServingPair:
    """A serving certificate and key, and the CA bundle that verifies them."""

    cert_file: Path
    key_file: Path
    ca_file: Path


@dataclass
class Pki:
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


def make_pki(directory: Path) -> Pki:
    pki = Pki(directory, create_ca(directory))
    pki.issue()
    return pki
