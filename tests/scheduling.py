"""Which pytest-xdist worker runs which test (scripts/test's ``--dist loadgroup``): the tests on Citus on a few
workers, the rest on any. Apart from tests/conftest.py (which imports the hook from here), so that the pytest runs
tests/test_lanes.py starts to check it import pytest and xdist alone, not simdb and every test dependency in
each of their workers (tests/conftest.py's imports: about 0.7 s of CPU a process)."""

from __future__ import annotations

import os

import pytest


def on_citus(nodeid: str) -> bool:
    """Whether a test runs on Citus, from its id alone (the ``backend`` parameter's id is ``citus``, or
    ``citus-id``)."""
    return "citus" in _parameters(nodeid).split("-")


def _parameters(nodeid: str) -> str:
    """The parameters' part of a test's id (``k3-citus`` of ``test_x[k3-citus]``), or ""."""
    return nodeid[nodeid.rfind("[") + 1:-1] if nodeid.endswith("]") else ""


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup`` (scripts/test), the tests on Citus go to the first 2 workers to report ready
    (SIMDB_TEST_CITUS_WORKERS=N for another number), sharing the run's one cluster: on one worker they were the floor
    of the not-slow lane (570 s of its 609 with 4 workers, load 6); on two they slow each other down (730 s of test
    time), and the lane took 557 s (load 7). Each of those workers takes the next test on Citus whenever it is nearly free (one test at
    a time, as every other test is sent), so that the two end together: split between them in turn beforehand, the
    one that drew the longest tests (a minute, some of them) ran on after the other. Once every test on Citus is
    sent, they take the other tests; the other workers never take one on Citus. xdist's own grouping (the tests
    marked ``xdist_group``, by a suffix it writes into their ids) groups nothing under pytest 9.2, whose ids live
    elsewhere: the tests would spread over every worker. Every other test goes where a worker is free, one at a
    time, in the order of pytest_collection_modifyitems."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    groups = os.environ.get("SIMDB_TEST_CITUS_WORKERS", "2")
    if not groups.isdigit() or int(groups) < 1:
        raise pytest.UsageError(f"SIMDB_TEST_CITUS_WORKERS={groups!r}: give how many workers run the tests on Citus "
                                "(1 or more)")
    groups = int(groups)

    class CitusOnFewWorkers(LoadGroupScheduling):
        def _assign_work_unit(self, node) -> bool:
            """Send ``node`` its next test: a worker of the Citus tests the next of them while any is left, then the
            others'; another worker the next test not on Citus. False where none is left for it."""
            on_citus_node = node in self.nodes[:groups]
            scope = next((scope for scope in self.workqueue if on_citus(scope) == on_citus_node), None)
            if scope is None and on_citus_node and self.workqueue:
                scope = next(iter(self.workqueue))
            if scope is None:
                return False
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
            return True

        def remove_node(self, node):
            workload = self.assigned_work.get(node, {})
            for scope in [scope for scope, unit in workload.items() if all(unit.values())]:
                del workload[scope]  # only what it had not run goes back to the queue
            return super().remove_node(node)

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 2:  # xdist's own heuristic: keep 1-3 tests queued
                return
            if not self._assign_work_unit(node):
                node.shutdown()  # only tests on Citus are left, for their workers

    return CitusOnFewWorkers(config, log)
