"""Several "nodes" on one machine: network namespaces joined by veth pairs through a bridge.

Node i lives in namespace ``<prefix>n<i>`` with address 10.213.0.<i+1>/24 on its veth; the bridge
(in the root namespace, 10.213.0.254) joins them, so the controller listens there and every node
reaches every other. ``throttle`` caps a node's link with ``tc ... tbf`` (a token bucket on its
egress: every all-reduce it is part of slows down, as with a degraded NIC or a bad cable).

With ``leaves``, a two-tier fabric: the nodes hang, in order and as evenly as they divide, from
leaf bridges ``<prefix>l<j>``, and each leaf joins the spine (the first bridge) through an uplink,
a veth pair ``<prefix>u<j>`` (leaf side) / ``<prefix>s<j>`` (spine side). ``throttle_uplink`` caps
both directions of one uplink; ``throttle_leaf`` caps every port of one leaf (toward its nodes and
toward the spine), as a failing switch would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

SUBNET = "10.213.0"
HOST = f"{SUBNET}.254"


# Bridged frames never go through the root namespace's iptables (br_netfilter, loaded by a container
# runtime, would run a leaf's traffic through a FORWARD chain whose policy may be DROP).
_NO_NETFILTER = ("nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _tbf(namespace: str, device: str, rate: str) -> None:
    """Cap the device's egress at ``rate`` with a token bucket (netem is not available here)."""
    shape = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"]
    subprocess.run(
        ["tc", "-n", namespace, "qdisc", "replace", "dev", device, *shape], check=True, capture_output=True, text=True
    )


def _tbf_root(device: str, rate: str) -> None:
    shape = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"]
    subprocess.run(["tc", "qdisc", "replace", "dev", device, *shape], check=True, capture_output=True, text=True)


def _remove_stale_subnet_holders() -> None:
    """Delete any link in the root namespace that holds an address on the test subnet: a bridge a
    killed run left behind would take the replies meant for this run's nodes (the same route twice)."""
    listing = subprocess.run(["ip", "-o", "-4", "addr", "show", "to", f"{SUBNET}.0/24"], capture_output=True, text=True)
    for line in listing.stdout.splitlines():
        device = line.split()[1]
        subprocess.run(["ip", "link", "del", device], capture_output=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"vgprobe{os.getpid() % 10000}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.strip()}"
    try:
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        _tbf(probe, "p0", "1mbit")
    except subprocess.CalledProcessError as exc:
        return f"cannot shape a link with tc tbf here: {exc.stderr.strip()}"
    finally:
        _ip("netns", "del", probe)
    return None


class Nodes:
    def __init__(self, count: int, prefix: str, leaves: int = 0) -> None:
        self.count, self.prefix, self.leaves = count, prefix, leaves
        self.bridge = f"{prefix}br"

    def leaf_of(self, i: int) -> int:
        return i * self.leaves // self.count

    def leaf_name(self, j: int) -> str:
        return f"leaf-{j}"

    def labels(self, names: list[str], key: str = "vigil.dev/leaf-switch") -> dict[str, dict[str, str]]:
        """Each node's leaf as a label, for the controller's ``node_labels``."""
        return {name: {key: self.leaf_name(self.leaf_of(i))} for i, name in enumerate(names)}

    def throttle_uplink(self, j: int, rate: str = "100mbit") -> None:
        for device in (f"{self.prefix}u{j}", f"{self.prefix}s{j}"):
            _tbf_root(device, rate)

    def throttle_leaf(self, j: int, rate: str = "100mbit") -> None:
        ports = [f"{self.prefix}h{i}" for i in range(self.count) if self.leaf_of(i) == j]
        for device in (*ports, f"{self.prefix}u{j}"):
            _tbf_root(device, rate)

    def unthrottle_fabric(self) -> None:
        devices = [f"{self.prefix}h{i}" for i in range(self.count)]
        devices += [f"{self.prefix}{end}{j}" for j in range(self.leaves) for end in "us"]
        for device in devices:
            subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], capture_output=True)

    def namespace(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(i)]

    def veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    def throttle(self, i: int, rate: str = "100mbit") -> None:
        _tbf(self.namespace(i), self.veth(i), rate)

    def unthrottle(self, i: int) -> None:
        subprocess.run(
            ["tc", "-n", self.namespace(i), "qdisc", "del", "dev", self.veth(i), "root"], capture_output=True
        )

    def _create(self) -> None:
        _remove_stale_subnet_holders()
        _ip("link", "add", self.bridge, "type", "bridge", *_NO_NETFILTER)
        _ip("addr", "add", f"{HOST}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for j in range(self.leaves):
            leaf, up, down = f"{self.prefix}l{j}", f"{self.prefix}u{j}", f"{self.prefix}s{j}"
            _ip("link", "add", leaf, "type", "bridge", *_NO_NETFILTER)
            _ip("link", "set", leaf, "up")
            _ip("link", "add", up, "type", "veth", "peer", "name", down)
            _ip("link", "set", up, "master", leaf, "up")
            _ip("link", "set", down, "master", self.bridge, "up")
        for i in range(self.count):
            ns, veth, host_end = self.namespace(i), self.veth(i), f"{self.prefix}h{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", veth)
            _ip("link", "set", veth, "netns", ns)
            bridge = f"{self.prefix}l{self.leaf_of(i)}" if self.leaves else self.bridge
            _ip("link", "set", host_end, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", veth)
            _ip("-n", ns, "link", "set", veth, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def reachable(self, timeout: float = 10.0) -> None:
        """Wait until every namespace can open a TCP connection to the bridge's address, or raise
        with what the root namespace holds (a test that would otherwise time out later, nameless)."""
        with socket.create_server((HOST, 0)) as server:
            port = server.getsockname()[1]
            probe = f"import socket; socket.create_connection(('{HOST}', {port}), timeout=2).close()"
            waiting = list(range(self.count))
            deadline = time.monotonic() + timeout
            while waiting and time.monotonic() < deadline:
                waiting = [
                    i
                    for i in waiting
                    if subprocess.run(
                        [*self.exec_prefix(i), sys.executable, "-c", probe], capture_output=True
                    ).returncode
                    != 0
                ]
                if waiting:
                    time.sleep(0.2)
        if waiting:
            addresses = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
            routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
            names = ", ".join(self.namespace(i) for i in waiting)
            raise RuntimeError(
                f"{names} cannot reach {HOST} within {timeout:.0f}s; addresses:\n{addresses}routes:\n{routes}"
            )

    def remove(self) -> None:
        for i in range(self.count):
            subprocess.run(["ip", "netns", "del", self.namespace(i)], capture_output=True)
            # The host end outlives its namespace while a process still runs in there.
            subprocess.run(["ip", "link", "del", f"{self.prefix}h{i}"], capture_output=True)
        for j in range(self.leaves):
            subprocess.run(["ip", "link", "del", f"{self.prefix}u{j}"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{self.prefix}l{j}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@contextmanager
def namespaced_nodes(count: int, prefix: str = "vg", leaves: int = 0) -> Iterator[Nodes]:
    nodes = Nodes(count, prefix, leaves)
    nodes.remove()  # what a killed earlier run left behind
    try:
        nodes._create()
        nodes.reachable()
        yield nodes
    finally:
        nodes.remove()
