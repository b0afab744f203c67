import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import math

import gin
import numpy as np
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


def check_moments(draws, mean, var, sigmas=5.0):
    """Monte Carlo mean and variance of `draws` (first axis: draws) against closed forms, to
    `sigmas` standard errors (the variance's from its chi-square spread)."""
    n = len(draws)
    draws = np.asarray(draws, np.float64)
    assert np.all(np.abs(draws.mean(0) - mean) < sigmas * np.sqrt(var / n) + 1e-6)
    assert np.all(np.abs(draws.var(0, ddof=1) - var) < sigmas * var * math.sqrt(2 / (n - 1)) + 1e-6)
