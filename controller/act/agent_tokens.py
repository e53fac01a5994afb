"""Agents that prove their node with a Kubernetes service-account token instead of a certificate.

A DaemonSet cannot hand each pod a certificate of its own node, but the API server can vouch for
a pod's node: the agent sends its projected service-account token (audience ``vigil``), and the
controller asks the API server (a TokenReview) whose it is. Since Kubernetes 1.30 the review of a
pod-bound token names the pod's node (``authentication.kubernetes.io/node-name``). The token is
accepted only if it is for the agents' service account and for this audience; the node it names is
the only node that agent may report for, as with a ``node:`` certificate.

Reviews are remembered for ``cache_s`` (keyed by the token's SHA-256, never the token itself), so
an agent reconnecting does not cost an API call each time; a refusal is not remembered. The review
itself is ``controller.act.kube.tokens``; what is decided from it is here.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vigil_core.config_file import ConfigModel

NODE_KEY = "authentication.kubernetes.io/node-name"


class ReviewUnavailable(Exception):
    """The API server could not be asked: the token is neither accepted nor refused (try again)."""


class AgentTokensConfig(ConfigModel):
    enabled: bool = Field(default=False, description="agents may connect with a service-account token")
    audience: str = Field(default="vigil", min_length=1, description="the projected token's audience")
    service_account: str = Field(
        default="system:serviceaccount:vigil:vigil-agent", pattern=r"^system:serviceaccount:[a-z0-9.-]+:[a-z0-9.-]+$"
    )
    cache_s: float = Field(default=60.0, ge=0, le=3600, description="how long a review is trusted")


def node_of(status: dict[str, Any], config: AgentTokensConfig) -> tuple[str, str]:
    """(node, "") from a TokenReview's status, or ("", why the token is refused). Pure."""
    if not status.get("authenticated"):
        return "", f"the API server did not accept the token: {status.get('error') or 'not authenticated'}"
    if config.audience not in (status.get("audiences") or []):
        return "", f"the token is not for audience {config.audience!r}"
    user = status.get("user") or {}
    if user.get("username") != config.service_account:
        return "", f"the token is {user.get('username')!r}'s, not the agents' ({config.service_account})"
    nodes = (user.get("extra") or {}).get(NODE_KEY) or []
    if len(nodes) != 1 or not nodes[0]:
        return "", "the token names no node (a pod-bound projected token on Kubernetes 1.30 or newer does)"
    return str(nodes[0]), ""
