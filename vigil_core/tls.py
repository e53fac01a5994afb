"""Mutual TLS between agents, trainer hooks, operators and the controller.

Every party holds a certificate signed by the cluster's Vigil CA, and its common name says who it
is: ``controller``, ``node:<node name>``, ``admin:<who>``, ``trainer:<name>`` or ``relay:<its DNS
name>`` (a ``vigil relay``: it serves agents under that name and carries their streams to the
controller). The controller
accepts only clients with such a certificate (the handshake refuses anybody else), and then:
an agent may report only for the node its certificate names; the admin service (sweeps, uncordon,
resume, status) needs an ``admin:`` certificate; the trainer gateway takes ``trainer:`` (or admin)
certificates.

The files are read from a directory laid out as a Kubernetes TLS secret (``ca.crt``, ``tls.crt``,
``tls.key``): what ``vigil certs`` writes, and what cert-manager issues. Plaintext is only for local
use (the demo, the tests), and must be asked for.

On Kubernetes a DaemonSet cannot give each pod a certificate of its own node. There every agent
holds one shared certificate, ``agents``, which admits it but names no node, and proves its node with
its projected service-account token, which the API server binds to the pod and its node. The token
goes with every call (``authorization: Bearer``, read afresh each time: the kubelet rotates it), and
the controller has the API server review it (``controller.act.agent_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

ROLES = ("controller", "agents", "node", "admin", "trainer", "relay")
UNNAMED = ("controller", "agents")  # the roles whose common name is the role alone
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"


class TlsError(ValueError):
    """A certificate directory that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    """This party's certificate and key, and the CA that signs the other side's; for an agent with
    the DaemonSet's shared ``agents`` certificate, also its token (``token_file``)."""

    ca: bytes
    cert: bytes
    key: bytes
    token_file: Path | None = None

    @classmethod
    def load(cls, directory: Path, token_file: Path | None = None) -> TlsFiles:
        found = {}
        for name in (CA_FILE, CERT_FILE, KEY_FILE):
            path = directory / name
            try:
                found[name] = path.read_bytes()
            except OSError as exc:
                raise TlsError(f"cannot read {path}: {exc.strerror or exc}") from None
            if b"-----BEGIN" not in found[name]:
                raise TlsError(f"{path} is not PEM")
        _check_pair(directory, found[CERT_FILE], found[KEY_FILE])
        if token_file is not None:
            read_token(token_file)  # fail now, naming the file, rather than on the first call
        return cls(found[CA_FILE], found[CERT_FILE], found[KEY_FILE], token_file)

    def server_credentials(self) -> grpc.ServerCredentials:
        """The controller's side: its certificate, and clients must show one from the same CA."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A client's side: the CA to trust the controller by, this party's own certificate, and its
        token on every call if it has one."""
        credentials = grpc.ssl_channel_credentials(self.ca, private_key=self.key, certificate_chain=self.cert)
        if self.token_file is None:
            return credentials
        return grpc.composite_channel_credentials(credentials, grpc.metadata_call_credentials(_Bearer(self.token_file)))


def _check_pair(directory: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """The key must be the certificate's: a mismatch (a directory caught half-rewritten, two files
    from different runs) would otherwise show only as failed handshakes."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as exc:
        raise TlsError(f"{directory / CERT_FILE} holds no readable certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: an encrypted key
        raise TlsError(f"{directory / KEY_FILE} holds no readable unencrypted private key: {exc}") from None
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(der, spki) != key.public_key().public_bytes(der, spki):
        raise TlsError(f"{directory / KEY_FILE} is not the key of {directory / CERT_FILE}")


def read_token(path: Path) -> str:
    """A bearer token file's token (a projected service-account token: one line)."""
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsError(f"cannot read the token in {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not token or any(c.isspace() for c in token):
        raise TlsError(f"{path} holds no token (one line, no spaces)")
    return token


class _Bearer(grpc.AuthMetadataPlugin):  # type: ignore[misc]
    """``authorization: Bearer <token>`` on every call, read from the file each time."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        try:
            callback((("authorization", f"Bearer {read_token(self.path)}"),), None)
        except TlsError as exc:
            callback((), exc)


@dataclass(frozen=True)
class Identity:
    role: str
    name: str = ""

    def __str__(self) -> str:
        return f"{self.role}:{self.name}" if self.name else self.role


def parse_identity(common_name: str) -> Identity | None:
    """``node:node-1`` → Identity("node", "node-1"); ``controller`` → Identity("controller"). None
    for anything else."""
    role, _, name = common_name.partition(":")
    if role not in ROLES or (role in UNNAMED) != (name == ""):
        return None
    return Identity(role, name)


def peer_identity(auth_context: Mapping[str, Sequence[bytes]]) -> Identity | None:
    """Who the peer of a TLS connection is, from its certificate's common name; None in plaintext."""
    names = auth_context.get("x509_common_name") or []
    return parse_identity(names[0].decode(errors="replace")) if names else None


def from_env(env: Mapping[str, str]) -> TlsFiles | None:
    """A client's certificates from VIGIL_TLS_DIR (the trainer hook, the launcher, the CLI); None: plaintext."""
    directory = env.get("VIGIL_TLS_DIR", "")
    return TlsFiles.load(Path(directory)) if directory else None


def transport_problem(tls_dir: Path | None, plaintext: bool) -> str:
    """What is wrong with a server's or an agent's choice of transport; "" when nothing. Pure."""
    if (tls_dir is None) == (not plaintext):
        return (
            "give tls_dir (mutual TLS: a directory from `vigil certs` or a cert-manager secret) "
            "or plaintext: true (no TLS, local use only), and not both"
        )
    return ""


# Liveness on the wire, not in Python: each side pings the other's HTTP/2 connection every 30 s and
# closes it when no answer comes within 10 s (a node powered off, a cable pulled), so a stream's end
# is what says an agent or a controller is gone. The server accepts pings that often.
KEEPALIVE_CLIENT = [("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000)]
KEEPALIVE_SERVER = [
    *KEEPALIVE_CLIENT,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]
# No bandwidth-delay probing on a connection that carries agents' streams only: an agent's channel,
# a relay's servers. gRPC pings each HTTP/2 connection as data arrives to size its flow-control
# windows for bulk transfers (its BDP estimator); an agent's stream carries small messages, and at
# 100,000 of them the pings and their answers cost both ends about a fifth of their CPU: bare
# servers with the same simulated fleet connected it in 50.8 and 42.2 s with the probe off against
# 59.4 and 62.0 s with it (servers' CPU 60.4 and 56.7 s against 74.3 and 76.8 s; bench.grpc_floor,
# interleaved). What carries batches keeps it: a relay's channel to the controller, and the
# controller's server, whose windows for the relays' streams grow with it (with the probe off there
# too, the faults' Hellos and the probes behind a late controller waited on those windows: fault ->
# cordon P99 451.6 ms against 215.8 ms beside it).
NO_BDP_PROBE = [("grpc.http2.bdp_probe", 0)]
# Reconnecting as soon as the other side is back. gRPC's channels share one pool of connections per
# process, and with it the backoff of each address's failed attempts (1 s, growing by 1.6 each time,
# up to 120 s): a new channel to an address that has been down a while inherits that backoff and
# fails at once until it runs out, whatever Vigil's own retry loop decides. A relay whose controller
# had been gone 17 s (a failover) reached the new leader 9.6 s after it served; after minutes down,
# an agent or a relay would wait up to two minutes more. Each channel keeps its own connections, and
# a channel kept open (a training job's reporter) tries again at least every 5 s.
RECONNECT_CLIENT = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_reconnect_backoff_ms", 5_000)]


MAX_CHANNEL_INT = 2**31 - 1  # gRPC's integer options are C ints

# How long a call may wait for the server's event loop to take it before gRPC's core cancels it
# (``grpc.server_max_unrequested_time_in_server``; gRPC's default 30 s). That wait is the server's
# own lateness, not the caller's: an agent's own patience (up to 160 s for a Hello) and the
# server's bounds once it takes the call (``first_message_s``, on its own time) judge the agent.
# With gRPC's 30 s, 100,000 agents connecting through 8 relays on 2 cores lost about 30,000 streams
# (the client reads CANCELLED, or INTERNAL while still sending its Hello) and reconnected.
UNREQUESTED_CALL_S = 600


def server_options(
    receive_bytes: int,
    send_bytes: int,
    waiting_calls: int,
    unrequested_s: int = UNREQUESTED_CALL_S,
    agents_only: bool = False,
) -> list[tuple[str, int]]:
    """A Vigil gRPC server's options (the controller's, a relay's): the largest message each way, a
    port of its own, keepalive, and room for ``waiting_calls`` calls waiting to be taken (a negative
    number, as an unlimited resource limit reads: as many as gRPC counts), each for up to
    ``unrequested_s``; ``agents_only`` (a relay's): no BDP probe (``NO_BDP_PROBE``)."""
    waiting = min(waiting_calls, MAX_CHANNEL_INT) if waiting_calls >= 0 else MAX_CHANNEL_INT
    return [
        ("grpc.server_max_unrequested_time_in_server", unrequested_s),
        ("grpc.max_receive_message_length", receive_bytes),
        ("grpc.max_send_message_length", send_bytes),
        # A port already in use is an error, not shared: with SO_REUSEPORT (gRPC's default) a second
        # controller, or an old one still stopping, would silently take half the agents.
        ("grpc.so_reuseport", 0),
        # gRPC refuses new calls at random once 1,000 wait for the server's event loop to take them,
        # and every one past 3,000 (the client reads CANCELLED, or INTERNAL while still sending its
        # Hello): 20,000 agents connecting at once through 3 relays lost 3,200 streams that way, each
        # to come back after a backoff. The server bounds what it admits itself (its agents, the
        # Hellos' turns), so every agent it may hold may wait.
        ("grpc.server.max_pending_requests", waiting),
        ("grpc.server.max_pending_requests_hard_limit", waiting),
        *KEEPALIVE_SERVER,
        *(NO_BDP_PROBE if agents_only else []),
    ]


def channel(target: str, tls: TlsFiles | None) -> grpc.Channel:
    """A blocking channel to the controller: mutual TLS when this party has certificates."""
    if tls is None:
        return grpc.insecure_channel(target, options=RECONNECT_CLIENT)
    return grpc.secure_channel(target, tls.channel_credentials(), options=RECONNECT_CLIENT)


def aio_channel_options(max_message_bytes: int = 0) -> list[tuple[str, int]]:
    """``aio_channel``'s options: a relay's to the controller where ``max_message_bytes`` is given
    (its batches, with gRPC's BDP probe), else an agent's (``NO_BDP_PROBE``). Pure."""
    sizes = [(f"grpc.max_{way}_message_length", max_message_bytes) for way in ("send", "receive")]
    return KEEPALIVE_CLIENT + RECONNECT_CLIENT + (sizes if max_message_bytes else NO_BDP_PROBE)


def aio_channel(target: str, tls: TlsFiles | None, max_message_bytes: int = 0) -> grpc.aio.Channel:
    """An asyncio channel to the controller: mutual TLS when this party has certificates; messages up
    to ``max_message_bytes`` each way where given (a relay's batches, which keep gRPC's BDP probe; an
    agent's small messages go without it, ``NO_BDP_PROBE``)."""
    options = aio_channel_options(max_message_bytes)
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.channel_credentials(), options=options)


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Listen on ``address`` (mutual TLS with ``credentials``; None: plaintext); the port bound. An
    OSError naming the address when it cannot (grpcio says so with a RuntimeError, or port 0)."""
    try:
        if credentials is not None:
            port = int(server.add_secure_port(address, credentials))
        else:
            port = int(server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address} (in use by another process?): {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {address} (in use by another process?)")
    return port
