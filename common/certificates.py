"""The serving certificate: files on disk, hot-reloaded into the TLS context without a restart.

Rotation follows controller-runtime's certwatcher: watch the files *and* poll every few seconds,
because kubelet publishes a renewed Secret by swapping a ``..data`` symlink, which file watchers
do not always report. A new pair (and client CA, when one is configured) is loaded into a fresh
context, so a half-written or mismatched pair is rejected and the old one keeps serving. Only
then does the fresh context go live: every new handshake switches to it from the server's SNI
callback (called for every ClientHello, with or without a server name). Reloads happen on the
event loop thread, so no handshake sees a mix. Connections already open keep their session, so
nothing is dropped.

:class:`ServingCertificate` has cert-manager's ``CertificateSource`` face: :meth:`context` (what
the server serves), :meth:`start` (keep it current until stopped) and :meth:`healthy` (None, or
why not). With a client CA (``--client-ca-file``) the admission port requires a client
certificate that chains to it: kube-apiserver's, configured through its
``--admission-control-config-file`` (docs/install.md, "Authenticated admission").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key

from common.metrics import WebhookMetrics

log = logging.getLogger("slime.serving")


class CertificateFileError(Exception):
    """A serving file cannot be used: ``field`` is the setting naming it, the message says why (one line)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _read(field: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CertificateFileError(field, f"cannot read {path}: {exc.strerror or exc}") from None


def check_certificate_files(cert_file: str, key_file: str, client_ca_file: str | None = None) -> None:
    """Raise :class:`CertificateFileError` when the files cannot be served: checked once at start.

    A missing, unreadable or wrong file at start is a configuration error (the chart mounts the
    TLS Secret before the container starts, so the files are there or the pod is misconfigured):
    the process stops with one line instead of running unready. Later changes go through
    :meth:`ServingCertificate.reload_if_changed`, which keeps the last good pair.
    """
    try:
        x509.load_pem_x509_certificates(_read("cert_file", cert_file))
    except ValueError:
        raise CertificateFileError("cert_file", f"{cert_file} holds no PEM certificate") from None
    try:
        load_pem_private_key(_read("key_file", key_file), password=None)
    except (ValueError, TypeError):
        raise CertificateFileError("key_file", f"{key_file} holds no unencrypted PEM private key") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise CertificateFileError(
            "key_file", f"{key_file} is not the key of the certificate in {cert_file} ({exc.reason or exc})"
        ) from None
    if client_ca_file is not None:
        try:
            x509.load_pem_x509_certificates(_read("client_ca_file", client_ca_file))
        except ValueError:
            raise CertificateFileError("client_ca_file", f"{client_ca_file} holds no PEM certificate") from None


def _file_stamp(path: str) -> tuple[str, int, int, int]:
    """Identity of what a path points to now: symlink target, inode, mtime and size."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_ino, st.st_mtime_ns, st.st_size


class ServingCertificate:
    """The server-side SSLContext given to the server, the live one behind it, and their files."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        metrics: WebhookMetrics,
        poll_seconds: float = 10.0,
        client_ca_file: str | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.poll_seconds = poll_seconds
        self._metrics = metrics
        self.context = self._new_context()  # the server's context; each handshake moves to ``_live``
        self._live = self.context
        self.context.sni_callback = self._to_live
        self.fingerprint = ""  # sha256 of the leaf certificate being served
        self.last_error = ""
        self._stamp: tuple[Any, ...] | None = None

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # HTTP/1.1 only: no HTTP/2, as kubebuilder defaults since the Rapid-Reset CVEs.
        context.set_alpn_protocols(["http/1.1"])
        if self.client_ca_file:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _to_live(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, current: ssl.SSLContext
    ) -> None:
        live = self._live
        if live is not current:
            connection.context = live

    @property
    def loaded(self) -> bool:
        return bool(self.fingerprint)

    def healthy(self) -> str | None:
        """None while a certificate is served, else why none is (a readiness check)."""
        return None if self.loaded else (self.last_error or "not loaded")

    def _files(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def reload_if_changed(self) -> bool:
        """Load the files if they changed since the last successful load. True if reloaded."""
        try:
            stamp = tuple(_file_stamp(path) for path in self._files())
        except OSError as exc:
            self._fail(f"cannot stat certificate files: {exc.strerror} ({exc.filename})")
            return False
        if stamp == self._stamp:
            return False
        try:
            with open(self.cert_file, "rb") as fh:
                pem = fh.read()
            leaf = x509.load_pem_x509_certificate(pem)
            fresh = self._new_context()
            fresh.load_cert_chain(self.cert_file, self.key_file)  # a bad pair fails here, before going live
            if self.client_ca_file:
                fresh.load_verify_locations(cafile=self.client_ca_file)
            if self._live is self.context:  # the first load: the server's own context serves it
                self.context.load_cert_chain(self.cert_file, self.key_file)
                if self.client_ca_file:
                    self.context.load_verify_locations(cafile=self.client_ca_file)
        except (OSError, ValueError, ssl.SSLError) as exc:
            what = ", ".join(self._files())
            self._fail(f"cannot load certificate files {what}: {exc}")
            return False
        self._live = fresh
        self._stamp = stamp
        self.fingerprint = hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()
        self.last_error = ""
        self._metrics.cert_reloads.labels("success").inc()
        self._metrics.cert_not_after.set(leaf.not_valid_after_utc.timestamp())
        log.info(
            "serving certificate loaded",
            extra={"fingerprint": self.fingerprint[:16], "not_after": str(leaf.not_valid_after_utc)},
        )
        return True

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            log.error("serving certificate not (re)loaded", extra={"error": message})
        self.last_error = message
        self._metrics.cert_reloads.labels("failure").inc()

    async def start(self, stop: asyncio.Event) -> None:
        """Keep the context current until ``stop``: reload on file events, and on every poll tick as a backstop."""
        from watchfiles import awatch

        async def on_events() -> None:
            dirs = sorted({os.path.dirname(os.path.abspath(p)) for p in (self.cert_file, self.key_file)})
            try:
                async for _ in awatch(*dirs, stop_event=stop, debounce=200, recursive=False):
                    self.reload_if_changed()
            except (OSError, RuntimeError) as exc:  # e.g. no inotify: the poll still covers us
                log.warning("certificate file watch unavailable; polling only", extra={"error": str(exc)})

        watcher = asyncio.create_task(on_events())
        try:
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_seconds)
                self.reload_if_changed()
        finally:
            watcher.cancel()
