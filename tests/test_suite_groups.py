"""The suite's worker groups hold (tests/conftest.py's pytest_collection_modifyitems).

Under ``make test`` (pytest-xdist, ``--dist loadgroup``) a file's tests share one worker and every
test that starts a Ray cluster shares the ``ray`` group. xdist carries a test's group in its node id
(``path::name@group``); when a pytest release stops reading the id xdist rewrites (pytest 9.2 did),
the groups are dropped without a word and the suite runs slower and flakier, so this checks the id
itself. Outside xdist (``make test-serial``, a single file) there are no groups to check."""

from __future__ import annotations

import os

import pytest


def _under_loadgroup(config: pytest.Config) -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and config.getvalue("loadgroup")


def test_a_tests_node_id_carries_its_files_group(request):
    if not _under_loadgroup(request.config):
        pytest.skip("not under pytest-xdist --dist loadgroup")
    assert (
        request.node.nodeid
        == "tests/test_suite_groups.py::test_a_tests_node_id_carries_its_files_group@tests/test_suite_groups.py"
    )


def test_the_group_of_a_ray_test_is_ray(request):
    # The group is chosen from the markers at collection; a ray-marked item gets "ray".
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None and marker.args == ("tests/test_suite_groups.py",)
    ray_items = [item for item in request.session.items if item.get_closest_marker("ray") is not None]
    assert all(item.get_closest_marker("xdist_group").args == ("ray",) for item in ray_items)
