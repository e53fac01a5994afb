"""How long Python's garbage collector stops this process, and its event loop with it.

A full collection walks every object the process holds: in a controller or a relay carrying
100,000 agents, millions. Each collection's time is added up per generation, with the longest, and
said on ``/metrics`` (``GcPauses``, registered by the controller's and the relay's metrics), so a
latency spike can be told from a collection. One callback per process, installed once.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_lock = threading.Lock()
_began: list[float] = [0.0]
_seen: dict[int, list[float]] = {}  # generation -> [collections, seconds in all, longest]
_collected = [0]  # unreachable objects found (garbage in reference cycles), every generation


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _began[0] = time.perf_counter()
        return
    took = time.perf_counter() - _began[0]
    seen = _seen.setdefault(int(info.get("generation", -1)), [0.0, 0.0, 0.0])
    seen[0] += 1
    seen[1] += took
    seen[2] = max(seen[2], took)
    _collected[0] += int(info.get("collected", 0))


def install() -> None:
    """Time every collection from now on (once per process, however often it is called)."""
    with _lock:
        if _on_collection not in gc.callbacks:
            gc.callbacks.append(_on_collection)


def collected() -> int:
    """Objects the collector found unreachable so far (garbage in reference cycles), all generations."""
    return _collected[0]


def seen() -> dict[int, tuple[int, float, float]]:
    """Per generation: collections, seconds in all, the longest one's seconds."""
    return {gen: (int(n), total, longest) for gen, (n, total, longest) in sorted(_seen.items())}


class GcPauses(Collector):
    """``vigil_gc_pause_seconds_total``, ``vigil_gc_pause_longest_seconds`` and
    ``vigil_gc_collections_total``, by generation, ``vigil_gc_collected_objects_total`` and
    ``vigil_gc_frozen_objects``."""

    def __init__(self) -> None:
        install()

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        total = CounterMetricFamily(
            "vigil_gc_pause_seconds",
            "Time the garbage collector stopped the process, by generation",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "vigil_gc_pause_longest_seconds",
            "The longest garbage collection so far, by generation",
            labels=["generation"],
        )
        count = CounterMetricFamily(
            "vigil_gc_collections",
            "Garbage collections so far, by generation (a full one, generation 2, walks every object)",
            labels=["generation"],
        )
        for gen, (n, seconds, most) in seen().items():
            total.add_metric([str(gen)], seconds)
            longest.add_metric([str(gen)], most)
            count.add_metric([str(gen)], n)
        yield total
        yield longest
        yield count
        yield CounterMetricFamily(
            "vigil_gc_collected_objects",
            "Objects the collector found unreachable (garbage in reference cycles), every generation",
            value=collected(),
        )
        yield GaugeMetricFamily(
            "vigil_gc_frozen_objects",
            "Objects the collector leaves out, frozen after a full collection (vigil_core.gc_keeper)",
            value=gc.get_freeze_count(),
        )
