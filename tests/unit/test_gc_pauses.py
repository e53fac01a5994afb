"""The collector's pauses on /metrics (``vigil_core.gc_pauses``): a full collection is seen."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest

from controller.metrics import ControllerMetrics
from controller.relay.metrics import RelayMetrics
from vigil_core import gc_pauses


def sample(registry: CollectorRegistry, name: str) -> float:
    text = generate_latest(registry).decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_a_full_collection_is_timed_and_said_by_the_controller_and_the_relay() -> None:
    controller, relay = ControllerMetrics(), RelayMetrics()
    before = gc_pauses.seen().get(2, (0, 0.0, 0.0))
    garbage = [[i] for i in range(200_000)]  # something to walk
    gc.collect(2)
    del garbage
    count, seconds, longest = gc_pauses.seen()[2]
    assert count >= before[0] + 1 and seconds > before[1] and longest > 0
    for registry in (controller.registry, relay.registry):
        assert sample(registry, 'vigil_gc_pause_seconds_total{generation="2"}') == seconds
        assert sample(registry, 'vigil_gc_pause_longest_seconds{generation="2"}') == longest
        assert sample(registry, 'vigil_gc_collections_total{generation="2"}') == count
    assert gc.callbacks.count(gc_pauses._on_collection) == 1  # one callback, however many registries
