"""Bayesian layers, one module per family: `dense`, `dropout` (and later convolutional,
recurrent, attention, Gaussian-process, stochastic-output and reversible layers)."""

from blayers.layers.base import BayesianLayer
from blayers.layers.dense import (
    DenseDVI,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
)
from blayers.layers.dropout import MCDropout

__all__ = [
    "BayesianLayer",
    "DenseDVI",
    "DenseFlipout",
    "DenseLocalReparameterization",
    "DenseReparameterization",
    "MCDropout",
]
