"""Bayesian layers, one module per family: `dense`, `convolutional`, `recurrent`, `attention`,
`embeddings`, `dropout` (and later Gaussian-process, stochastic-output and reversible layers).
The forward passes of the estimators live once in `estimators`."""

from blayers.layers.attention import MultiHeadAttentionFlipout, MultiHeadAttentionReparameterization
from blayers.layers.base import BayesianLayer
from blayers.layers.convolutional import *
from blayers.layers.convolutional import __all__ as _conv_names
from blayers.layers.dense import (
    DenseDVI,
    DenseFlipout,
    DenseLocalReparameterization,
    DenseReparameterization,
)
from blayers.layers.dropout import MCDropout
from blayers.layers.embeddings import EmbeddingReparameterization
from blayers.layers.gaussian_process import (
    GaussianLikelihood,
    GaussianProcess,
    RandomFourierFeatures,
    SparseGaussianProcess,
)
from blayers.layers.recurrent import (
    GRUCellFlipout,
    GRUCellReparameterization,
    LSTMCellFlipout,
    LSTMCellReparameterization,
)
from blayers.layers.reversible import (
    MADE,
    ActNorm,
    Permute,
    RealNVP,
    Reverse,
    ReversibleLayer,
    RevNetBlock,
    RevNetStack,
)
from blayers.layers.stochastic_output import (
    Bernoulli,
    Categorical,
    Discretize,
    MixtureLogistic,
    MixtureNormal,
    Normal,
    Poisson,
)
from blayers.layers.vector_quantizer import VectorQuantizer

__all__ = [  # noqa: PLE0604 - includes the convolution names
    "BayesianLayer",
    "DenseReparameterization",
    "DenseFlipout",
    "DenseLocalReparameterization",
    "DenseDVI",
    "MCDropout",
    *_conv_names,
    "LSTMCellReparameterization",
    "LSTMCellFlipout",
    "GRUCellReparameterization",
    "GRUCellFlipout",
    "MultiHeadAttentionReparameterization",
    "MultiHeadAttentionFlipout",
    "EmbeddingReparameterization",
    "GaussianProcess",
    "SparseGaussianProcess",
    "RandomFourierFeatures",
    "GaussianLikelihood",
    "Normal",
    "Bernoulli",
    "Categorical",
    "Poisson",
    "MixtureLogistic",
    "MixtureNormal",
    "Discretize",
    "VectorQuantizer",
    "ReversibleLayer",
    "Reverse",
    "Permute",
    "ActNorm",
    "MADE",
    "RealNVP",
    "RevNetBlock",
    "RevNetStack",
]
