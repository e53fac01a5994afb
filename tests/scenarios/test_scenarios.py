"""Every labelled scenario of the benchmark (``bench/scenarios/cases``), run as a test through the
real processes. A scenario marked ``known_defect`` is expected to fail (strictly: once the defect
is fixed the mark must go)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scenarios.runner import run_scenario, unavailable
from bench.scenarios.score import judge
from bench.scenarios.spec import load_scenario, scenario_paths

pytestmark = pytest.mark.e2e


def _case(path: Path) -> object:
    scenario = load_scenario(path)
    marks = [pytest.mark.xfail(reason=scenario.known_defect, strict=True)] if scenario.known_defect else []
    if why := unavailable(scenario):
        marks.append(pytest.mark.skip(reason=why))
    if scenario.fleet.fabric is not None:  # network namespaces on one subnet: one at a time
        marks += [pytest.mark.xdist_group("netns"), pytest.mark.timeout(240)]  # all-reduces on a loaded machine
    else:
        marks.append(pytest.mark.timeout(90))
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.parametrize("path", [_case(p) for p in scenario_paths()])
def test_scenario(path: Path) -> None:
    scenario = load_scenario(path)
    outcome = judge(path.stem, scenario, run_scenario(path.stem, scenario))
    assert outcome.passed, "; ".join(outcome.problems)
