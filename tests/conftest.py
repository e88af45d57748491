"""Shared test fixtures.

Random tests draw from one seed per run: MLA_TEST_SEED when set (CI sets it in .ci/run, so its
runs repeat), else a fresh one. The seed is printed in the run's header and, for a failing
test, in its captured output; `MLA_TEST_SEED=<seed> python -m pytest ...` replays the run. Each
test's generator is seeded by (run seed, test id), so a test draws the same values whether it
runs alone or in the whole suite."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

RUN_SEED = int(os.environ.get("MLA_TEST_SEED") or np.random.SeedSequence().entropy % (2**63))


def pytest_report_header(config):
    return f"MLA_TEST_SEED={RUN_SEED} (random tests; set it to replay this run)"


@pytest.fixture
def rng(request):
    request.node.user_properties.append(("seed", RUN_SEED))
    print(f"[seed] {request.node.nodeid}: MLA_TEST_SEED={RUN_SEED}")
    return np.random.default_rng([RUN_SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """The session's shared exports (tests/exports.py)."""
    from exports import Exports

    return Exports(tmp_path_factory)
