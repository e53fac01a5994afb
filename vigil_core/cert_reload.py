"""Renewed certificates taken up without a restart.

cert-manager renews a certificate well before it expires (by default a third of its life before),
and the kubelet swaps the secret's files in the pod's volume; ``vigil certs`` run again rewrites
them in place. A controller or agent that read its files once at start would keep the old ones
until the pod happened to restart, and stop being trusted when they expire.

So the files are read again when a new connection needs them, and nowhere else:
- the controller's and a relay's servers ask on every incoming handshake (grpcio's dynamic server
  credentials call ``fetch``; an unchanged directory costs three small reads), each server (a main
  port, an urgent port) with credentials of its own;
- an agent, and a relay's stream to the controller, read them each time they open a channel, i.e.
  on every reconnection.
An established connection keeps the certificates it was made with; TLS checks them only in the
handshake.

A directory caught half-written, or one whose key does not match its certificate, is not taken:
the last good files stay in use, and the refusal is logged once per distinct content.

``expires_at`` (a metric, re-read at every scrape) says when the certificate in use expires, so an
alert can name a renewal that did not happen or was not taken up.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import grpc
import structlog

from vigil_core.tls import TlsError, TlsFiles

log = structlog.get_logger(__name__)


class CertificateSource:
    """The newest usable certificate files of one directory (a ``vigil certs`` party, or a secret)."""

    def __init__(self, directory: Path, token_file: Path | None = None) -> None:
        self.directory = directory
        self._token_file = token_file
        self._current = TlsFiles.load(directory, token_file)  # at start, a bad directory is an error
        self._expiry = not_after(self._current.cert)
        self._refused = ""
        self._lock = threading.Lock()  # grpcio calls ``fetch`` from its own threads

    @property
    def current(self) -> TlsFiles:
        return self._current

    def refresh(self) -> TlsFiles | None:
        """Read the directory again: the new files if they changed and can be used, else None."""
        with self._lock:
            try:
                found = TlsFiles.load(self.directory, self._token_file)
            except TlsError as exc:
                self._refuse(str(exc))
                return None
            self._refused = ""  # usable again: a later problem is news, even the same one
            if found == self._current:
                return None
            fingerprint = hashlib.sha256(found.ca + found.cert + found.key).hexdigest()
            self._current, self._expiry = found, not_after(found.cert)
            log.info("tls_certificates_reloaded", directory=str(self.directory), sha256=fingerprint[:16])
            return found

    def latest(self) -> TlsFiles:
        """The files to open a connection with: re-read, or the last good ones."""
        self.refresh()
        return self._current

    def expires_at(self) -> float:
        """When the certificate in use expires (unix seconds), after reading the directory again."""
        self.refresh()
        return self._expiry

    def _refuse(self, reason: str) -> None:
        if reason != self._refused:  # once per distinct problem, not on every handshake
            self._refused = reason
            log.warning("tls_certificates_not_reloaded", directory=str(self.directory), reason=reason)


def not_after(cert_pem: bytes) -> float:
    """The end of a PEM certificate's validity, in unix seconds (the first one of a chain)."""
    from cryptography import x509

    return x509.load_pem_x509_certificates(cert_pem)[0].not_valid_after_utc.timestamp()


def _configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], root_certificates=files.ca)


def server_credentials(source: CertificateSource) -> grpc.ServerCredentials:
    """The controller's side: its certificate and the CA that clients must show one from, both
    re-read before each new client's handshake. Credentials for one server: each server (the main
    port's, the urgent port's) takes its own, and each takes up new files at its next handshake,
    whichever server read them first."""
    served = [source.current]  # what this server's handshakes use now

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            source.refresh()
        except Exception:  # never fail a handshake for the reload: the current files still serve
            log.exception("tls_reload_error", directory=str(source.directory))
            return None
        if (current := source.current) is served[0]:
            return None
        served[0] = current
        return _configuration(current)

    return grpc.dynamic_ssl_server_credentials(_configuration(served[0]), fetch, require_client_authentication=True)
