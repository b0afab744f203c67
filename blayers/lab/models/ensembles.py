"""The main job's MLP as one of the field's single-pass ensembles or evidential networks.

`efficient_mlp(method=...)` builds the `mlp` of the main job (hidden widths `hidden_units`) as:

* `'packed'`: Packed-Ensembles (Laurent et al., 2023), `PackedDense` layers with `alpha`,
  `gamma` and `ensemble_size` members on a tiled batch;
* `'masksembles'`: `Dense` layers each followed by `Masksembles1D(ensemble_size, scale)`
  (Durasov et al., 2021) on a tiled batch;
* `'mimo'`: `MIMO` (Havasi et al., 2021) around the MLP, with `input_repetition_probability`
  and `batch_repetitions`;
* `'evidential'`: the MLP with a `Dirichlet` head (Sensoy et al., 2018) for classification or a
  `NormalInverseGamma` head (Amini et al., 2020) for regression.

The ensembles end in the members' mixture (`EnsembleOutput`), categorical or Normal by
`likelihood`; the tasks read any of them as they read BatchEnsemble's.
"""

import gin
import keras

from blayers import layers

__all__ = ["EFFICIENT_METHODS", "efficient_mlp"]

EFFICIENT_METHODS = ("packed", "masksembles", "mimo", "evidential")


@gin.configurable(module="blayers.lab.models")
def efficient_mlp(
    input_shape,
    num_outputs,
    method="packed",
    hidden_units=(256, 256),
    activation="relu",
    likelihood="categorical",
    ensemble_size=4,
    alpha=2,
    gamma=1,
    scale=2.0,
    input_repetition_probability=0.0,
    batch_repetitions=2,
    annealing_steps=0,
    evidence_regularizer=0.01,
    seed=None,
    name=None,
):
    """The main job's MLP as `method`'s network (see the module).

    Args:
      input_shape, num_outputs: from the data (regression: `2 d` outputs, a mean and a scale
        per target, as the task's layout).
      method: one of `EFFICIENT_METHODS`.
      hidden_units: widths of the base network's hidden layers.
      activation: of the hidden layers.
      likelihood: `'categorical'` (classification) or `'normal'` (regression).
      ensemble_size: members `M` of the ensembles.
      alpha, gamma: Packed-Ensembles' width multiplier and groups (the paper's 2 and 1 by
        default; the first hidden layer has one group).
      scale: Masksembles' mask scale.
      input_repetition_probability, batch_repetitions: MIMO's `rho` and `r`.
      annealing_steps: the Dirichlet head's KL annealing.
      evidence_regularizer: the NormalInverseGamma head's `lambda`.
      seed: seeds the masks and MIMO's permutations.
      name: the model's name (default `'<method>_mlp'`).
    """
    if method not in EFFICIENT_METHODS:
        raise ValueError(
            f"efficient_mlp: method must be one of {EFFICIENT_METHODS}, got {method!r}."
        )
    if likelihood not in ("categorical", "normal"):
        raise ValueError(
            f"efficient_mlp: likelihood must be 'categorical' or 'normal', got {likelihood!r}."
        )
    hidden_units = (hidden_units,) if isinstance(hidden_units, int) else tuple(hidden_units)
    m = ensemble_size
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Flatten()(inputs) if len(input_shape) > 1 else inputs
    if method == "mimo":
        network = keras.Sequential(
            [keras.Input((x.shape[-1] * m,))]
            + [keras.layers.Dense(u, activation=activation) for u in hidden_units]
            + [keras.layers.Dense(m * num_outputs)],
            name="subnetworks",
        )
        outputs = layers.MIMO(
            network,
            m,
            distribution=likelihood,
            input_repetition_probability=input_repetition_probability,
            batch_repetitions=batch_repetitions,
            seed=seed,
            name="members",
        )(x)
    elif method == "evidential":
        for i, units in enumerate(hidden_units):
            x = keras.layers.Dense(units, activation=activation, name=f"dense_{i}")(x)
        if likelihood == "categorical":
            outputs = layers.Dirichlet(
                num_outputs, annealing_steps=annealing_steps, name="evidence"
            )(x)
        else:
            outputs = layers.NormalInverseGamma(
                num_outputs // 2, evidence_regularizer=evidence_regularizer, name="evidence"
            )(x)
    else:
        x = layers.EnsembleTile(m, name="tile")(x)
        for i, units in enumerate(hidden_units):
            if method == "packed":
                x = layers.PackedDense(
                    units,
                    alpha,
                    m,
                    gamma=gamma,
                    first=i == 0,
                    activation=activation,
                    name=f"packed_{i}",
                )(x)
            else:
                x = keras.layers.Dense(units, activation=activation, name=f"dense_{i}")(x)
                mask_seed = None if seed is None else seed + i
                x = layers.Masksembles1D(m, scale, seed=mask_seed, name=f"masks_{i}")(x)
        if method == "packed":
            x = layers.PackedDense(num_outputs, alpha, m, last=True, name="packed_out")(x)
        else:
            x = keras.layers.Dense(num_outputs, name="logits")(x)
        outputs = layers.EnsembleOutput(m, distribution=likelihood, name="members")(x)
    return keras.Model(inputs, outputs, name=name or f"{method}_mlp")
