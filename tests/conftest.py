"""Checks on the run itself: a test that cannot run as the suite means fails, saying why."""

from __future__ import annotations

import pytest

_UNGROUPED = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` pytest-xdist keeps a group on one worker by writing the group into each
    of its tests' ids. Where the installed pytest and pytest-xdist do not agree on that, each such test
    fails at once with the reason, instead of failing later as a flake."""
    if not getattr(config.option, "loadgroup", False):  # set on each worker by pytest-xdist
        return
    for item in items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            item.stash[_UNGROUPED] = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_UNGROUPED, False):
        pytest.fail(
            f"--dist loadgroup is not in effect with pytest {pytest.__version__}: this test's xdist_group does"
            " not keep it off the other workers (tests sharing one subnet or one port would run at once);"
            " install the versions pyproject.toml pins",
            pytrace=False,
        )
