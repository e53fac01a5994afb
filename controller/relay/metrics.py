"""What a relay says about itself on ``/metrics`` (``vigil relay --metrics-port``); its ``/readyz`` is
503 while it has no stream to the controller, so a Service sends agents only to relays that can
carry them."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vigil_core import loop_lag
from vigil_core.gc_pauses import GcPauses

HELLO_ANSWER_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        r.register(GcPauses())  # the collector's pauses: the event loop's too
        self.agents = Gauge("vigil_relay_agents", "Agent streams this relay carries now", registry=r)
        self.certificate_expiry = Gauge(
            "vigil_relay_certificate_expiry_timestamp_seconds",
            "When the relay's certificate in use expires (unix time); 0 in plaintext",
            registry=r,
        )
        self.uplink_up = Gauge(
            "vigil_relay_uplink_up", "1 while the relay's stream to the controller is open", registry=r
        )
        self.queued = Gauge("vigil_relay_queued_bytes", "Agents' messages not yet sent to the controller", registry=r)
        self.uplink_losses = Counter(
            "vigil_relay_uplink_losses_total",
            "Times the stream to the controller broke (the agents it carried were ended)",
            registry=r,
        )
        self.uplink_tries_failed = Counter(
            "vigil_relay_uplink_tries_failed_total",
            "Tries to reach the controller that failed (the next replica is tried at once, then again after a pause)",
            registry=r,
        )
        self.messages = Counter(
            "vigil_relay_messages_total",
            "Messages carried, by direction (up: to the controller)",
            ["direction"],
            registry=r,
        )
        self.uplink_messages = Counter(
            "vigil_relay_uplink_messages_total",
            "Messages on the stream to the controller, by direction, each carrying many agents' "
            "(vigil_relay_messages_total over it: how many each carried)",
            ["direction"],
            registry=r,
        )
        self.first = Counter(
            "vigil_relay_sent_first_total",
            "Agents' messages carrying a signal that may act, sent before the backlog (the relay's first lane)",
            registry=r,
        )
        self.task_failures = Counter(
            "vigil_relay_task_failures_total",
            "Failures of the relay's background work, by task (each logged; the task starts again)",
            ["task"],
            registry=r,
        )
        self.refused = Counter(
            "vigil_relay_agents_refused_total",
            "Agent streams the relay refused or ended itself, by why"
            " (identity, no_controller, no_hello, hello_again_late; not_urgent: a Hello with no fault waiting on the"
            " urgent port)",
            ["why"],
            registry=r,
        )

        self.hello_again = Counter(
            "vigil_relay_hello_again_total",
            "Agent sessions ended with the agent's call kept, asked for Hello again on it, by why"
            " (controller_lost: the relay reached the controller again; paced: the controller gave a later turn;"
            " queued: no room at the controller for the Hello yet, the agent told to wait until called, or, its"
            " first Hello kept here, told nothing until its answer)",
            ["why"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "vigil_relay_event_loop_lag_seconds",
            "How much later than due the relay's event loop ran a tick every 0.1 s (every agent's stream on it"
            " waited as long; its bounds on agents, no_hello and hello_again_late, leave it out)",
            buckets=loop_lag.BUCKETS_S,
            registry=r,
        )
        self.hello_answer = Histogram(
            "vigil_relay_hello_answer_seconds",
            "How long each agent's Hello waited at this relay for the controller's answer (an Ack, a later turn,"
            " or a refusal): an agent gives up on one after 10 s at first, then twice as long each time",
            buckets=HELLO_ANSWER_BUCKETS_S,
            registry=r,
        )
        self.hello_queued = Histogram(
            "vigil_relay_hello_queued_seconds",
            "How long each agent queued for room at the controller (told to wait, or lined up when the relay"
            " reached the controller again) waited here until called: its Hello then passed on, or asked for",
            buckets=HELLO_ANSWER_BUCKETS_S,
            registry=r,
        )
        self.left_queued = Counter(
            "vigil_relay_hellos_left_queued_total",
            "Agents whose call ended while they were queued for room at the controller (gone before called: their"
            " wait is not in vigil_relay_hello_queued_seconds)",
            registry=r,
        )
        self.hellos_waiting = Gauge(
            "vigil_relay_hellos_waiting",
            "Agents' Hellos passed on to the controller and not answered yet (at most the relay's room; the"
            " other agents are queued)",
            registry=r,
        )
        self.hellos_queued = Gauge(
            "vigil_relay_hellos_queued",
            "Agents told to wait for room at the controller for their Hello, each called in turn as a place comes free",
            registry=r,
        )
        self.hello_room = Gauge(
            "vigil_relay_hello_room",
            "Hellos this relay passes on to the controller at once, at most: smaller while they wait there past"
            " --hello-wait-s, larger while agents are queued and they wait less",
            registry=r,
        )
        self.dropped_between_sessions = Counter(
            "vigil_relay_dropped_between_sessions_total",
            "Agents' messages sent after their session ended and before their Hello again (not acknowledged:"
            " the agent sends its signals again)",
            registry=r,
        )
        self.urgent_hellos = Counter(
            "vigil_relay_urgent_hellos_total",
            "Agents' Hellos that said faults wait in their spool (Hello.urgent_waiting), asked for or said unasked:"
            " their agents are called before those queued without",
            registry=r,
        )
        self.kept_unasked = Counter(
            "vigil_relay_hellos_kept_unasked_total",
            "Agents' Hellos said unasked while the relay reached the controller again, kept here and passed on"
            " when it had room, by what they said (urgent: faults wait; calm: none)",
            ["said"],
            registry=r,
        )
        self.hellos_crossed = Counter(
            "vigil_relay_hellos_crossed_total",
            "Hellos an agent said again (a fault came) after the one before had gone on to the controller: not"
            " passed on, the answer to the one before is theirs",
            registry=r,
        )

    def watch_room(self, waiting: Callable[[], int], queued: Callable[[], int], room: Callable[[], int]) -> None:
        """The relay's Hellos at the controller, the agents queued, and the room (``controller.relay.hello_room``)."""
        self.hellos_waiting.set_function(waiting)
        self.hellos_queued.set_function(queued)
        self.hello_room.set_function(room)

    def watch(self, carried: Callable[[], int], up: Callable[[], bool], queued: Callable[[], int]) -> None:
        self.agents.set_function(carried)
        self.uplink_up.set_function(lambda: 1 if up() else 0)
        self.queued.set_function(queued)
