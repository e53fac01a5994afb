from __future__ import annotations

import resource

from controller.edge.open_files import needed, raised_to

INF = resource.RLIM_INFINITY


def test_the_soft_limit_goes_to_what_is_needed_as_far_as_the_hard_limit_allows() -> None:
    assert needed(100_000) == 101_024
    assert raised_to(1024, 1_048_576, 101_024) == 101_024
    assert raised_to(1024, 4096, 101_024) == 4096  # as far as it goes; the controller says the rest
    assert raised_to(1024, INF, 101_024) == 101_024
    assert raised_to(200_000, 1_048_576, 101_024) == 200_000  # never lowered
    assert raised_to(INF, INF, 101_024) == INF
