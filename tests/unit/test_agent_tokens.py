"""What an agent's token review must say for the controller to take it (controller.act.agent_tokens),
and how the shared certificate and the bearer header are read."""

from __future__ import annotations

from typing import Any

import pytest

from controller.act.agent_tokens import NODE_KEY, AgentTokensConfig, node_of
from controller.edge.authz import bearer
from vigil_core.tls import Identity, parse_identity

CONFIG = AgentTokensConfig(enabled=True)
AGENT = "system:serviceaccount:vigil:vigil-agent"


def review(**changes: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "authenticated": True,
        "audiences": ["vigil"],
        "user": {"username": AGENT, "extra": {NODE_KEY: ["gpu-007"], "authentication.kubernetes.io/pod-name": ["a"]}},
    }
    return {**status, **changes}


def test_a_review_of_an_agent_pod_token_names_its_node() -> None:
    assert node_of(review(), CONFIG) == ("gpu-007", "")


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"authenticated": False, "error": "token expired"}, "did not accept the token: token expired"),
        ({"audiences": ["https://kubernetes.default.svc"]}, "not for audience 'vigil'"),
        ({"audiences": None}, "not for audience 'vigil'"),
        (
            {"user": {"username": "system:serviceaccount:ml:trainer", "extra": {NODE_KEY: ["gpu-007"]}}},
            "not the agents'",
        ),
        ({"user": {"username": AGENT, "extra": {}}}, "names no node"),
        ({"user": {"username": AGENT, "extra": {NODE_KEY: ["a", "b"]}}}, "names no node"),
        ({"user": {"username": AGENT, "extra": {NODE_KEY: [""]}}}, "names no node"),
    ],
)
def test_anything_else_is_refused_with_the_reason(changes: dict[str, Any], why: str) -> None:
    node, problem = node_of(review(**changes), CONFIG)
    assert node == "" and why in problem


def test_the_bearer_token_is_read_from_the_authorization_header_only() -> None:
    assert bearer((("user-agent", "grpc"), ("authorization", "Bearer abc.def"))) == "abc.def"
    assert bearer((("authorization", "Basic abc"),)) == ""
    assert bearer(None) == "" and bearer(()) == ""


def test_the_shared_agents_certificate_names_no_node() -> None:
    assert parse_identity("agents") == Identity("agents")
    assert parse_identity("agents:gpu-1") is None
    assert parse_identity("node:gpu-1") == Identity("node", "gpu-1")
