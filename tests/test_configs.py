"""Every gin file in configs/ parses and configures what it names."""

import pathlib

import gin
import pytest

import blayers

CONFIGS = sorted((pathlib.Path(__file__).parent.parent / "configs").rglob("*.gin"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.name))
def test_gin_file_parses(path):
    gin.parse_config_file(str(path))
    layer = blayers.layers.DenseFlipout(3)
    assert layer.kernel_regularizer is not None


def test_prior_fragment_swaps_the_prior():
    gin.parse_config_files_and_bindings(
        [str(p) for p in CONFIGS if p.name == "scale_mixture.gin"],
        ["scale_mixture_kl_divergence.pi = 0.25"],
    )
    reg = blayers.layers.DenseReparameterization(3).kernel_regularizer
    assert isinstance(reg, blayers.regularizers.ScaleMixtureKLDivergence) and reg.pi == 0.25
