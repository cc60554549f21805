"""conftest.py - shared fixtures of the Python tests: the header names the liblmk under test, and `rng` gives
each test a fresh random generator (seeded per run and printed, so a failure can be replayed with
LMK_TEST_SEED)."""
import os
import random
import zlib

import pytest

SEED = int(os.environ.get("LMK_TEST_SEED") or random.SystemRandom().randrange(2 ** 31))


def pytest_report_header(config):
    try:
        import lmk
    except Exception as e:  # the tests themselves report the failure
        return "lmk: cannot import (%s)" % e
    return "lmk %s from %s (%s); LMK_TEST_SEED=%d" % (lmk.version(), lmk.LIBRARY_PATH, lmk.build_info(), SEED)


@pytest.fixture
def rng(request):
    np = pytest.importorskip("numpy")
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])
