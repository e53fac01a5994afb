"""What one client may send (the ``limits:`` section of the controller's configuration)."""

from __future__ import annotations

from pydantic import Field

from vigil_core.config_file import ConfigModel
from vigil_core.switch_interval import INTERVAL_MS


class LimitsConfig(ConfigModel):
    """What one client may send: beyond these, a call is refused (RESOURCE_EXHAUSTED) and logged."""

    max_message_bytes: int = Field(default=4 << 20, ge=64 << 10, le=64 << 20, description="one gRPC message")
    agent_messages_per_s: float = Field(default=20.0, gt=0, description="per node: heartbeats, batches, results")
    agent_burst: int = Field(default=200, ge=1)
    reports_per_s: float = Field(default=5.0, gt=0, description="per training job: Progress and Plan calls")
    report_burst: int = Field(default=50, ge=1)
    check_results_per_node_hour: int = Field(
        default=120, ge=1, description="check results nobody asked for, stored per node and hour; past it, counted"
    )
    max_nodes: int = Field(
        default=100_000,
        ge=1,
        description="nodes the controller knows at most; a Hello from a new one beyond is refused",
    )
    hellos_per_s: float = Field(
        default=2000.0,
        gt=0,
        description="agents connected directly admitted per second once more than hello_burst come at once (a restart, "
        "a failover); each one turned away is given its turn (RESOURCE_EXHAUSTED with vigil-retry-after-ms). A relay's "
        "agents are not paced here: the relay meters their Hellos itself (vigil relay --hello-wait-s)",
    )
    hello_burst: int = Field(default=5000, ge=1, description="Hellos admitted at once before the pacing begins")
    first_message_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="an agent's stream with no Hello within this long is closed (DEADLINE_EXCEEDED): a peer that "
        "opens streams and says nothing holds no resources past it; counted on the controller's own time, its "
        "event loop's lateness left out (vigil_core.loop_lag)",
    )
    gc_young_objects: int = Field(
        default=50_000,
        ge=0,
        le=10_000_000,
        description="the garbage collector's young collections every this many new objects (0: CPython's 700): "
        "what an agent's message makes dies young instead of making full collections come every minute or two "
        "at 100,000 nodes (vigil_core.gc_young)",
    )
    switch_interval_ms: float = Field(
        default=INTERVAL_MS,
        ge=0,
        le=1000,
        description="how long the event loop's thread runs Python before another thread that waits (the store's "
        "writer, an action's) may take the interpreter (0: CPython's 5 ms): each hand-over is a chance for the loop "
        "to wait for a CPU again on a busy host (vigil_core.switch_interval)",
    )
    gc_freeze: bool = Field(
        default=False,
        description="experimental: freeze what survives each full garbage collection while the fleet is calm, "
        "thawing it once a quarter of the sessions ended (vigil_core.gc_keeper); off until it is shown to hold "
        "through a 100,000-agent reconnection (docs/design.md)",
    )
    max_seq_gap: int = Field(
        default=10_000_000,
        ge=1000,
        description="a signal numbered this far past its spool's last one is refused (INVALID_ARGUMENT), "
        "not taken: taking it would silence every later signal of that spool",
    )
