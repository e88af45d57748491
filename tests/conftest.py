"""Shared test fixtures.

Random tests draw a fresh seed each run (printed, so a failure can be replayed with
MLA_TEST_SEED=<seed>)."""

from __future__ import annotations

import os

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("MLA_TEST_SEED", np.random.SeedSequence().entropy % (2**63)))
    request.node.user_properties.append(("seed", seed))
    print(f"[seed] {request.node.nodeid}: MLA_TEST_SEED={seed}")
    return np.random.default_rng(seed)
