"""Names that cross the wire: node names (as Kubernetes spells them), job ids and the addresses
agents advertise. Pure."""

from __future__ import annotations

import ipaddress
import re

# A Kubernetes node name: a DNS subdomain (RFC 1123), lower case.
NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# A job id: letters, digits and -_. ; it names files and Slack threads, so nothing else.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,126}[A-Za-z0-9])?$")
# Where an agent's peers reach it: a host name or an IP address (v4 or v6); empty: not given.
ADDRESS_RE = re.compile(r"^[A-Za-z0-9.:\-]{0,253}$")


def is_node_name(name: str) -> bool:
    return bool(NODE_NAME_RE.match(name))


def is_job_id(name: str) -> bool:
    return bool(JOB_ID_RE.match(name))


def is_address(text: str) -> bool:
    return bool(ADDRESS_RE.match(text))


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only ("localhost", 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
