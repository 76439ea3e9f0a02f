import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_generate_tests(metafunc):
    # Every test that takes a `backend` runs once per simulation engine: the same body on both.
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", ["amaranth", "verilator"], indirect=True)


@pytest.fixture
def backend(request):
    from sim.backends import get_backend
    return get_backend(request.param)
