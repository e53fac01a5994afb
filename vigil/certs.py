"""``vigil certs``: a CA and the certificates of a Vigil cluster, for mutual TLS (``vigil_core.tls``).

    vigil certs ./vigil-certs --controller-name vigil-controller.vigil.svc --nodes gpu-001,gpu-002 \\
        --admin alice --trainer jobs [--agents] [--relay vigil-relay.vigil.svc]

writes one directory per party, each laid out as a Kubernetes TLS secret (ca.crt, tls.crt, tls.key;
``kubectl create secret generic NAME --from-file=DIR``): ``controller/``, ``node-<name>/``,
``admin-<who>/``, ``trainer-<name>/``, ``agents/`` (the DaemonSet's shared certificate: it admits an
agent, whose service-account token then proves its node), ``relay-<name>/`` (a ``vigil relay``: its
name is the DNS name agents dial it by, and it serves them and calls the controller with it); and
``ca/`` with the CA's key, which stays with whoever issues certificates. A second run with the same
directory reuses the CA and adds only what is new: a party whose key and certificate are there
already keeps them (``renew`` issues the named parties' again). Every run sets every key to 0600 and
every directory to 0700, whatever the umask and whatever they had become. Keys are ECDSA P-256;
certificates last ``days``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vigil_core.names import is_node_name
from vigil_core.tls import CA_FILE, CERT_FILE, KEY_FILE

_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62})$")
Key = ec.EllipticCurvePrivateKey


class CertsError(ValueError):
    pass


def create(
    out: Path,
    controller_names: Sequence[str],
    nodes: Sequence[str] = (),
    admins: Sequence[str] = (),
    trainers: Sequence[str] = (),
    days: int = 365,
    agents: bool = False,
    renew: bool = False,
    relays: Sequence[str] = (),
) -> tuple[list[Path], list[Path]]:
    """Write (or add to) a cluster's certificates; returns the directories written and those kept
    as they were (already there, ``renew`` not asked)."""
    bad = [n for n in nodes if not is_node_name(n)] + [n for n in (*admins, *trainers, *relays) if not _NAME.match(n)]
    if bad:
        raise CertsError(f"{bad[0]!r} is not a usable name (lower case letters, digits, -._)")
    if not controller_names:
        raise CertsError("give the controller's names (--controller-name): the DNS names or IPs agents dial")
    ca_key, ca_cert = _ca(out / "ca", days)
    parties = [("controller", "controller", list(controller_names))]
    parties += [(f"node-{n}", f"node:{n}", []) for n in nodes]
    parties += [(f"admin-{n}", f"admin:{n}", []) for n in admins]
    parties += [(f"trainer-{n}", f"trainer:{n}", []) for n in trainers]
    parties += [("agents", "agents", [])] if agents else []
    parties += [(f"relay-{n}", f"relay:{n}", [n]) for n in relays]
    written, kept = [], []
    for directory, common_name, names in parties:
        if not renew and (out / directory / KEY_FILE).exists() and (out / directory / CERT_FILE).exists():
            kept.append(out / directory)
            continue
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(ca_key, ca_cert, key, common_name, names, days)
        _write(out / directory, ca_cert, key, cert)
        written.append(out / directory)
    _tighten(out)
    return written, kept


def _tighten(out: Path) -> None:
    """0700 on the tree's directories, 0600 on its keys: on every run, so a loosened one is mended."""
    for directory in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        directory.chmod(0o700)
    for key in [*out.rglob("*.key")]:
        key.chmod(0o600)


def _ca(directory: Path, days: int) -> tuple[Key, x509.Certificate]:
    key_path, cert_path = directory / "ca.key", directory / CA_FILE
    if key_path.exists() and cert_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CertsError(f"{key_path} is not an ECDSA key")
        return key, x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Vigil CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    _mkdir(directory)
    _private(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _issue(
    ca_key: Key, ca_cert: x509.Certificate, key: Key, common_name: str, names: Sequence[str], days: int
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    usage = [ExtendedKeyUsageOID.SERVER_AUTH] if names else [ExtendedKeyUsageOID.CLIENT_AUTH]
    if common_name.startswith("relay:"):  # agents' server and the controller's client
        usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _mkdir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)  # mkdir's mode goes through the umask


def _write(directory: Path, ca_cert: x509.Certificate, key: Key, cert: x509.Certificate) -> None:
    _mkdir(directory)
    (directory / CA_FILE).write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (directory / CERT_FILE).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _private(directory / KEY_FILE, key)


def _private(path: Path, key: Key) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT; the umask too
        f.write(pem)
