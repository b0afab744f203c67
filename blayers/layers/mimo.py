"""MIMO (Havasi et al., ICLR 2021): `M` independent subnetworks inside one network, trained with
`M` inputs and `M` outputs.

The wrapped `network` reads `M` inputs concatenated on the last axis (`[B, ..., M C]`) and
writes `M` heads concatenated on the last axis (`[B, M k]`). In training, member `m`'s input at
row `i` is example `pi_m(i)` of the batch, for independent permutations `pi_m`, so each head
learns to predict from its own input alone; at test time every member reads the same example
and the heads form an ensemble at the cost of one forward pass. Two knobs of the paper:

* input repetition (`input_repetition_probability = rho`): a fraction `rho` of the rows give
  every member the same example (the members then share more features);
* batch repetition (`batch_repetitions = r`): the batch is repeated `r` times before the
  permutations, so each example is seen `r` times a step, by different partners.

The permutations are drawn inside the layer, and each head's outputs are put back in example
order (row `i` of member `m` is example `i`'s prediction), so the targets need no reshuffling:
the layer returns the members' mixture like `EnsembleOutput` (`blayers.layers.ensemble`), and
the training loss fits every member (and every repetition) on its own examples
(`EnsembleMixture.member_log_prob`), as the paper's independent heads.
"""

import tensorflow as tf

from blayers.layers.base import NamedOutput, NestedLayers, SeededLayer, register
from blayers.layers.ensemble import (
    check_ensemble_likelihood,
    check_ensemble_size,
    ensemble_random_variable,
)

__all__ = ["MIMO"]


@register
class MIMO(NestedLayers, NamedOutput, SeededLayer):
    """Multi-input multi-output ensemble around `network`: `[B, ...]` inputs -> a
    `RandomVariable` over the `M` heads' uniform mixture (`EnsembleMixture`, batch `[B]`).

    Args:
      network: a Keras layer or model from `[B, ..., M C]` (the members' inputs side by side on
        the last axis) to `[B, M k]` (member `m`'s `k` outputs at `[m k, (m + 1) k)`).
      ensemble_size: members `M`.
      distribution: the heads' likelihood, as `EnsembleOutput`: `'categorical'` (logits) or
        `'normal'` (`k = 2 d` means and softplus-scales).
      input_repetition_probability: `rho`, the fraction of training rows on which every member
        reads the same example (the paper uses 0.5 on ImageNet, 0 on CIFAR).
      batch_repetitions: `r`, copies of the batch each member sees a step (the paper's 4 on
        CIFAR).
      seed: seeds the permutations.
      output_name: the returned random variable's name (default: the layer's).
      **kwargs: `keras.layers.Layer` arguments.
    """

    nested_layer_args = ("network",)

    def __init__(
        self,
        network,
        ensemble_size,
        distribution="categorical",
        input_repetition_probability=0.0,
        batch_repetitions=1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = f"MIMO ({self.name})"
        self.network = network
        self.ensemble_size = check_ensemble_size(name, ensemble_size)
        check_ensemble_likelihood(name, distribution)
        if not 0.0 <= input_repetition_probability <= 1.0:
            raise ValueError(
                f"{name}: input_repetition_probability must be in [0, 1], got "
                f"{input_repetition_probability!r}."
            )
        self.batch_repetitions = check_ensemble_size(f"{name} batch_repetitions", batch_repetitions)
        self.distribution = distribution
        self.input_repetition_probability = float(input_repetition_probability)

    def build(self, input_shape):
        packed = (*input_shape[:-1], input_shape[-1] * self.ensemble_size)
        if not self.network.built:
            self.network.build(packed)

    def _training_indices(self, batch):
        """`M` index vectors of length `r B`: a shared shuffle of `r` copies of `0..B-1`, each
        member re-shuffling its first `(1 - rho)` part (uncertainty-baselines' recipe)."""
        tiled = tf.tile(tf.range(batch), [self.batch_repetitions])
        main = tf.random.experimental.stateless_shuffle(tiled, seed=self.next_seed())
        rows = batch * self.batch_repetitions
        shuffled = tf.cast(
            tf.cast(rows, tf.float32) * (1.0 - self.input_repetition_probability), tf.int32
        )
        return [
            tf.concat(
                [
                    tf.random.experimental.stateless_shuffle(
                        main[:shuffled], seed=self.next_seed()
                    ),
                    main[shuffled:],
                ],
                0,
            )
            for _ in range(self.ensemble_size)
        ]

    def call(self, inputs, training=None):
        x = tf.convert_to_tensor(inputs, self.compute_dtype)
        m = self.ensemble_size
        indices = self._training_indices(tf.shape(x)[0]) if training else None
        members = [tf.gather(x, i) for i in indices] if training else [x] * m
        outputs = self.network(tf.concat(members, axis=-1), training=training)
        outputs = tf.convert_to_tensor(outputs, self.compute_dtype)
        size = outputs.shape[-1]
        if size is None or size % m:
            raise ValueError(
                f"MIMO ({self.name}): the network's last axis ({size}) must hold "
                f"ensemble_size = {m} heads side by side."
            )
        heads = tf.transpose(tf.reshape(outputs, [-1, m, size // m]), [1, 0, 2])  # [M, rows, k]
        members_count = m
        if training:
            # Back to example order: row i of every head (and repetition) is example i.
            order = tf.stack([tf.argsort(i, stable=True) for i in indices])
            heads = tf.gather(heads, order, batch_dims=1)  # [M, B r, k], example-major
            r = self.batch_repetitions
            heads = tf.reshape(heads, [m, -1, r, size // m])
            heads = tf.transpose(heads, [0, 2, 1, 3])  # [M, r, B, k]
            members_count = m * r
        heads = tf.reshape(heads, [-1, size // m])
        return ensemble_random_variable(
            heads, members_count, self.distribution, f"MIMO ({self.name})"
        )

    def compute_output_shape(self, input_shape):
        if self.distribution == "categorical":
            return (input_shape[0],)
        packed = (*input_shape[:-1], input_shape[-1] * self.ensemble_size)
        size = self.network.compute_output_shape(packed)[-1]
        return (input_shape[0], size // self.ensemble_size // 2)

    def get_config(self):
        return {
            **super().get_config(),
            **self._nested_config(),
            "ensemble_size": self.ensemble_size,
            "distribution": self.distribution,
            "input_repetition_probability": self.input_repetition_probability,
            "batch_repetitions": self.batch_repetitions,
        }
