"""``bench.scale``'s garbage-collection figures, read from a real /metrics: each generation's
collections, seconds and longest pause beside the totals."""

from __future__ import annotations

import gc

from prometheus_client import start_http_server

from bench.scale import gc_figures
from controller.relay.metrics import RelayMetrics
from tests.helpers import free_port


def test_the_figures_say_each_generation_as_the_process_says_it() -> None:
    metrics, port = RelayMetrics(), free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    try:
        garbage = [[i] for i in range(100_000)]  # something to walk
        gc.collect(2)
        del garbage
        figures = gc_figures(port)
    finally:
        server.shutdown()
        thread.join(timeout=5)
    full = figures["by_generation"]["2"]
    assert full[0] >= 1 and full[1] >= 0 and full[2] > 0  # collections, seconds in all, the longest
    assert figures["full_n"] == full[0]
    by_generation = sum(seconds for _, seconds, _ in figures["by_generation"].values())
    assert abs(figures["total_s"] - by_generation) <= 0.02  # each rounded to 10 ms
    assert figures["longest_s"] == max(longest for _, _, longest in figures["by_generation"].values())
