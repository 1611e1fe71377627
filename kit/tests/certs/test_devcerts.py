"""The development PKI: CA and leaf certificates (usages, names, chain), key file modes, the CLI's defaults, errors."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.devcerts import create_ca, issue_client_cert, issue_serving_cert, main, write_dev_pki


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName), [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


def usages(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_a_ca_can_sign_only_leaves_and_its_key_is_private(tmp_path: Path) -> None:
    ca = create_ca(tmp_path / "pki", common_name="test-ca", days=2)
    cert = load(tmp_path / "pki" / "ca.crt")
    assert cert == ca.cert and ca.pem == (tmp_path / "pki" / "ca.crt").read_bytes()
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    key_usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert key_usage.key_cert_sign and key_usage.crl_sign and not key_usage.digital_signature
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "test-ca"
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 2  # 2 days, plus 5 minutes of skew
    assert stat.S_IMODE((tmp_path / "pki" / "ca.key").stat().st_mode) == 0o600


def test_a_serving_certificate_names_every_san_and_is_for_servers_only(tmp_path: Path) -> None:
    ca = create_ca(tmp_path)
    cert = issue_serving_cert(
        ca, tmp_path / "tls.crt", tmp_path / "tls.key", ["svc.ns.svc", "localhost"], ["127.0.0.1", "::1"]
    )
    assert cert == load(tmp_path / "tls.crt")
    assert sans(cert) == (["svc.ns.svc", "localhost"], ["127.0.0.1", "::1"])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "svc.ns.svc"
    assert usages(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.issuer == ca.cert.subject
    cert.verify_directly_issued_by(ca.cert)
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    # The pair loads as a TLS server's (certificate and key match).
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")


def test_an_ip_only_serving_certificate_is_named_by_its_ip(tmp_path: Path) -> None:
    cert = issue_serving_cert(create_ca(tmp_path), tmp_path / "t.crt", tmp_path / "t.key", [], ["192.0.2.1"])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "192.0.2.1"


@pytest.mark.parametrize(
    ("dns", "ips", "message"),
    [
        ([], [], "a serving certificate needs at least one DNS name or IP address"),
        (["localhost"], ["not-an-ip"], "does not appear to be an IPv4 or IPv6 address"),
    ],
)
def test_a_serving_certificate_refuses_bad_names(tmp_path: Path, dns: list[str], ips: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        issue_serving_cert(create_ca(tmp_path), tmp_path / "t.crt", tmp_path / "t.key", dns, ips)
    assert not (tmp_path / "t.key").exists(), "nothing written for a refused certificate"


def test_a_client_certificate_carries_the_user_and_group(tmp_path: Path) -> None:
    ca = create_ca(tmp_path)
    cert = issue_client_cert(
        ca, tmp_path / "c.crt", tmp_path / "c.key", "kube-apiserver", organization="system:masters"
    )
    assert cert.subject.rfc4514_string() == "CN=kube-apiserver,O=system:masters"
    assert usages(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_reissuing_replaces_the_pair(tmp_path: Path) -> None:
    ca = write_dev_pki(tmp_path, ["localhost"], [])
    first = load(tmp_path / "tls.crt")
    issue_serving_cert(ca, tmp_path / "tls.crt", tmp_path / "tls.key", ["localhost"], [])
    assert load(tmp_path / "tls.crt").serial_number != first.serial_number
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]  # no .tmp left


def test_the_cli_defaults_to_localhost_and_127_0_0_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--out", str(tmp_path / "dev")])
    assert sans(load(tmp_path / "dev" / "tls.crt")) == (["localhost"], ["127.0.0.1"])
    assert capsys.readouterr().out.strip().endswith("for localhost, 127.0.0.1")
    main(["--out", str(tmp_path / "dns"), "--dns", "webhook.slime.svc"])  # each list keeps its own default
    assert sans(load(tmp_path / "dns" / "tls.crt")) == (["webhook.slime.svc"], ["127.0.0.1"])


def test_the_cli_names_a_bad_ip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path), "--ip", "999.1.1.1"])
    assert exit_.value.code == 2
    assert "'999.1.1.1' does not appear to be an IPv4 or IPv6 address" in capsys.readouterr().err
