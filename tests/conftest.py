import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import gin
import pytest

import blayers


@pytest.fixture(autouse=True)
def _seed_and_clean_gin():
    blayers.set_seed(0)
    gin.clear_config()
    yield
    gin.clear_config()


def sigma_tolerance(standard_error, sigmas=5.0):
    """Tolerance of `sigmas` standard errors (tests of Monte Carlo estimates)."""
    return sigmas * standard_error
