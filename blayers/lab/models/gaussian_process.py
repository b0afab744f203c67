"""Deep Gaussian processes: stacked `SparseGaussianProcess` layers (Salimbeni & Deisenroth,
2017; the paper's Figure 5) ending in a `GaussianLikelihood`.

Inner layers have `hidden_units` outputs (default `min(input_dim, 30)`, as Salimbeni &
Deisenroth), a mean function at the identity (`inner_mean`: trained from there, `'linear'`, or
fixed there, `'identity'`, as theirs) and a small initial variational scale, so the stack starts
near a single GP; the last layer has a zero mean and `q(u)` starting at the prior's scale.

Salimbeni & Deisenroth's own start (their code and bayesian_benchmarks') is `inner_mean =
'identity'`, `length_scale = 'sqrt_width'`, `inner_variational_scale = 1e-5` and
`noise_variance = 0.01`; the defaults here are blayers' earlier ones, which the SVGP and DGP-2
rows of the UCI table were trained with.
"""

import gin
import keras
import numpy as np

from blayers.lab.tasks import Regression
from blayers.lab.tasks.base import features
from blayers.layers.gp import GaussianLikelihood, SparseGaussianProcess
from blayers.replicas import fold_seed

__all__ = ["deep_gp"]


@gin.configurable(module="blayers.lab.models")
def deep_gp(
    input_shape,
    num_outputs,
    depth=2,
    num_inducing=100,
    hidden_units=None,
    covariance_fn="exponentiated_quadratic",
    inner_variational_scale=1e-3,
    noise_variance=0.1,
    whiten=True,
    inducing_inputs_initializer="random_normal",
    inner_mean="linear",
    length_scale=1.0,
    cholesky_dtype=None,
    name="deep_gp",
    replicas=None,
):
    """`depth` SVGP layers with `num_inducing` inducing points each, then `GaussianLikelihood`.

    `num_outputs` is the regression task's output size; the GP predicts its
    `Regression.target_dim(num_outputs)` targets and the likelihood supplies the noise, whose
    expectation under the last layer's marginals the task takes in closed form.
    `inducing_inputs_initializer='kmeans'` starts every layer's inducing inputs at k-means
    centres of what reaches it (Salimbeni & Deisenroth's initialization): of its first training
    batch, or with replicas of each replica's training inputs under the inner means' starting
    map, computed here from its seed.

    Args:
      inner_mean: the inner layers' mean function, `'linear'` (trained, starting at the
        identity) or `'identity'` (fixed, as Salimbeni & Deisenroth: the identity, or with
        replicas, for inputs wider than `hidden_units`, each replica's projection onto its
        training inputs' top principal directions; without replicas that needs
        `hidden_units >= input_dim`).
      length_scale: every layer's initial kernel length scales: a positive number, or
        `'sqrt_width'` for the square root of the layer's input width (bayesian_benchmarks').
      cholesky_dtype: the dtype of the layers' factorizations (`'float64'`: the UCI tables').
      replicas: None, or the `blayers.lab.data.Replica`s of replicated data: every layer then
        has `replicas=R` (`blayers.replicas`), each replica its own inducing inputs, kernels,
        `q(u)` and noise; inputs `[R, batch, d]`.
      (the others: the layers' arguments, `SparseGaussianProcess` and `GaussianLikelihood`)
    """
    if depth < 1:
        raise ValueError(f"deep_gp needs depth >= 1, got {depth}.")
    input_dim = int(np.prod(input_shape))
    hidden = hidden_units or min(input_dim, 30)
    _check_inner_mean("deep_gp", inner_mean)
    if replicas is None and inner_mean == "identity" and depth > 1 and input_dim > hidden:
        raise ValueError(
            f"deep_gp: inner_mean='identity' needs hidden_units >= input_dim (got {hidden} < "
            f"{input_dim}): a fixed projection of wider inputs needs the data, which replicated "
            "data brings. Set hidden_units, or inner_mean='linear'."
        )
    group, reaching = {}, None
    if replicas is not None:
        group = {"replicas": len(replicas), "replica_seeds": [r.seed for r in replicas]}
        # What reaches layer i at the start, per replica: the training inputs, then their
        # image under each inner mean's starting map.
        reaching = [features(r.data.train).reshape(-1, input_dim) for r in replicas]
        model_layers = [keras.Input((None, input_dim))]
    else:
        model_layers = [keras.Input(tuple(input_shape))]
        if len(input_shape) > 1:
            model_layers.append(keras.layers.Flatten())
    width = input_dim
    for i in range(depth):
        last = i == depth - 1
        initializer, projection = inducing_inputs_initializer, None
        if replicas is not None:
            if inducing_inputs_initializer == "kmeans":
                initializer = keras.initializers.Constant(
                    _replica_centres(reaching, replicas, num_inducing, width, salt=10 + i)
                )
            if not last and inner_mean == "identity" and width > hidden:
                projection = np.stack([principal_directions(x, hidden) for x in reaching])
        model_layers.append(
            SparseGaussianProcess(
                Regression.target_dim(num_outputs) if last else hidden,
                num_inducing=num_inducing,
                mean_fn="zero" if last else inner_mean,
                covariance_fn=covariance_fn,
                whiten=whiten,
                initial_variational_scale=1.0 if last else inner_variational_scale,
                inducing_inputs_initializer=initializer,
                length_scale=initial_length_scale(length_scale, width, "deep_gp"),
                cholesky_dtype=cholesky_dtype,
                mean_projection=projection,
                name=f"gp_{i}",
                **group,
            )
        )
        if reaching is not None and projection is not None:
            reaching = [x @ p for x, p in zip(reaching, projection)]
        elif reaching is not None:  # eye(width, hidden): the first `hidden` features
            reaching = [x[:, :hidden] for x in reaching]
        width = hidden
    model_layers.append(GaussianLikelihood(noise_variance, name="likelihood", **group))
    return keras.Sequential(model_layers, name=name)


def _replica_centres(reaching, replicas, num_inducing, width, salt):
    """`[R, M, width]`: each replica's k-means centres of what reaches a layer (from its seed
    and the layer's `salt`), zero-padded to the layer's width."""
    seeds = [fold_seed(replica.seed, salt) for replica in replicas]
    centres = np.stack([kmeans_centres(x, num_inducing, s) for x, s in zip(reaching, seeds)])
    if centres.shape[-1] < width:  # an inner width above the inputs'
        centres = np.pad(centres, ((0, 0), (0, 0), (0, width - centres.shape[-1])))
    return centres


def _check_inner_mean(name, inner_mean):
    if inner_mean not in ("linear", "identity"):
        raise ValueError(f"{name}: inner_mean must be 'linear' or 'identity', got {inner_mean!r}.")


def initial_length_scale(length_scale, width, name):
    """A layer's initial length scales: `length_scale`, or `sqrt(width)` for `'sqrt_width'`
    (bayesian_benchmarks' start for Salimbeni & Deisenroth's deep GP, a scale at which
    standardized inputs of `width` features are neither all near nor all far apart)."""
    if length_scale == "sqrt_width":
        return float(np.sqrt(width))
    try:
        value = float(length_scale)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(length_scale, (str, bool)) or not value > 0:
        raise ValueError(
            f"{name}: length_scale must be a positive number or 'sqrt_width', got {length_scale!r}."
        )
    return value


def principal_directions(x, units):
    """`[d, units]`: the top right singular vectors of `x` (uncentred, as Salimbeni &
    Deisenroth's fixed projection of inputs wider than a deep GP's inner layers)."""
    _, _, vt = np.linalg.svd(np.asarray(x, np.float64), full_matrices=False)
    return vt[:units].T.astype(np.float32)


def kmeans_centres(x, num_inducing, seed):
    """`num_inducing` k-means centres of the rows of `x` (`scipy.cluster.vq.kmeans2` from
    distinct random rows, as Salimbeni & Deisenroth start their inducing inputs); with fewer
    rows than centres, the rows and then standard normal draws."""
    from scipy.cluster.vq import kmeans2

    x = np.asarray(x, np.float64)
    rng = np.random.default_rng(seed)
    if len(x) <= num_inducing:
        extra = rng.standard_normal((num_inducing - len(x), x.shape[1]))
        return np.concatenate([x, extra]).astype(np.float32)
    centres, _ = kmeans2(x, num_inducing, minit="points", seed=rng)
    return centres.astype(np.float32)
