"""Bayesian recurrent cells: `LSTMCellReparameterization`, `LSTMCellFlipout`,
`GRUCellReparameterization`, `GRUCellFlipout`.

A Bayesian RNN draws its weights once per *sequence* (Fortunato et al., 2017; the paper's
Figure 1), not per time step: `get_initial_state` draws the kernel and recurrent kernel (and, for
Flipout, the per-example signs) and every step of the sequence reuses them. The cells work in
`keras.layers.RNN` (which calls `get_initial_state` at the start of every batch) and in a
hand-written loop:

    lstm = blayers.layers.LSTMCellReparameterization(512)
    state = lstm.get_initial_state(features)      # draws this sequence's weights
    with tf.GradientTape() as tape:
        for t in range(features.shape[1]):
            net, state = lstm(features[:, t], state)
        kl = sum(lstm.losses)                     # the KL of this sequence's weights

The draw is a random variable per weight and a seed; each step forms the weights from the
variables with that draw, so the gradients reach every variational parameter wherever
`get_initial_state` was called, inside the tape or before it.

Gates follow Keras (`LSTMCell`: i, f, c, o with `unit_forget_bias`; `GRUCell` with
`reset_after=True`). If a cell is called before any `get_initial_state` (e.g. `RNN` given an
explicit `initial_state`), it draws its weights on that first step.
"""

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import sampling
from blayers.layers.base import BayesianLayer, register
from blayers.layers.dense import dense_matmul
from blayers.layers.estimators import FlipoutEstimator, ReparameterizationEstimator

__all__ = [
    "GRUCellFlipout",
    "GRUCellReparameterization",
    "LSTMCellFlipout",
    "LSTMCellReparameterization",
]


def _graph():
    """The graph being built, or None when executing eagerly."""
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


class _Sequence:
    """One sequence's draw: the weights' random variables as first drawn, the seed of the
    estimator's noise, the batch size, the graph it was drawn in (None: eager), the eager noise
    cache, and (graph mode) the weights formed at the draw."""

    def __init__(self, draws, seed, batch_size):
        self.draws, self.seed, self.batch_size = draws, seed, batch_size
        self.graph = _graph()
        self.noise = {}
        self.formed = None

    def in_own_graph(self):
        return _graph() is self.graph

    def is_stale(self):
        """Drawn in a graph that the current one is neither nor nested in (an earlier trace)."""
        if self.graph is None:
            return False
        graph = _graph()
        while graph is not None:
            if graph is self.graph:
                return False
            graph = getattr(graph, "outer_graph", None)
        return True


class _CellBase(BayesianLayer):
    """Weights `kernel` (input_dim, gates*units), `recurrent_kernel` (units, gates*units) and
    `bias`; the per-sequence draw; the sequence's KL in `losses`."""

    gates = None
    _args_doc = """    Args:
      units: state size.
      activation: cell activation (default tanh).
      recurrent_activation: gate activation (default sigmoid).
      use_bias: add biases.
      kernel_initializer, recurrent_initializer: distribution initializers (default
        `'trainable_normal'`) make the input and recurrent kernels random, drawn once per
        sequence; Keras initializer names make them deterministic.
      bias_initializer: the bias's initializer (default zeros; the LSTM's forget gate starts at
        one, `unit_forget_bias`).
      kernel_regularizer, recurrent_regularizer: the kernels' KL terms (default `'prior'`).
      bias_regularizer: the bias's regularizer (default None).
      kernel_constraint, recurrent_constraint, bias_constraint: Keras constraints of
        deterministic weights.
      unit_forget_bias: (LSTM cells) forget-gate bias starts at 1, as Keras' LSTMCell.
      seed: seeds the Flipout signs.
      implementation: 1 or 2, accepted for edward2's and Keras 2's code (how those split the
        gates' matmuls); both compute the same map here.
      **kwargs: `keras.layers.Layer` arguments.
"""

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        kernel_initializer="trainable_normal",
        recurrent_initializer="trainable_normal",
        bias_initializer="zeros",
        kernel_regularizer="prior",
        recurrent_regularizer="prior",
        bias_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        seed=None,
        implementation=2,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        if implementation not in (1, 2):
            raise ValueError(
                f"{type(self).__name__}: implementation must be 1 or 2, got {implementation!r}."
            )
        self.implementation = implementation
        if not isinstance(units, int) or units <= 0:
            raise ValueError(
                f"{type(self).__name__} needs a positive integer `units`, got {units!r}."
            )
        self.units = units
        self.activation = keras.activations.get(activation)
        self.recurrent_activation = keras.activations.get(recurrent_activation)
        self.use_bias = use_bias
        self._configure_weight("kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        self._configure_weight(
            "recurrent_kernel", recurrent_initializer, recurrent_regularizer, recurrent_constraint
        )
        self._configure_weight("bias", bias_initializer, bias_regularizer, bias_constraint)
        object.__setattr__(self, "_sequence", None)
        self._num_draws = 0  # sequences begun (eager calls; a tf.function counts its trace)

    # Keras' (and edward2's) names of the recurrent kernel's settings.
    @property
    def recurrent_initializer(self):
        return self.recurrent_kernel_initializer

    @property
    def recurrent_regularizer(self):
        return self.recurrent_kernel_regularizer

    @property
    def recurrent_constraint(self):
        return self.recurrent_kernel_constraint

    def build(self, input_shape):
        input_dim = input_shape[-1]
        self.add_bayesian_weight("kernel", (input_dim, self.gates * self.units))
        self.add_bayesian_weight("recurrent_kernel", (self.units, self.gates * self.units))
        if self.use_bias:
            self.add_bayesian_weight("bias", self._bias_shape())
        else:
            self.bias = None

    def _bias_shape(self):
        return (self.gates * self.units,)

    # -- the sequence's draw ---------------------------------------------------------------------
    def begin_sequence(self, batch_size):
        """Draws this sequence's weights (and Flipout signs) for `batch_size` examples.

        What is drawn is the weights' random variables (interceptors such as `blayers.tape` see
        them once per sequence) and the seed of the estimator's noise. Every step forms the
        weights again from the variables with that same draw, so a gradient tape opened after
        `get_initial_state` (the paper's Figure 1) still reaches every variational parameter,
        and so does the sequence's KL in `losses`. Eager steps reuse the sequence's noise
        (`blayers.sampling.reuse_draws`); in a `tf.function` the weights are also formed once
        here, for steps traced in a nested graph (the `tf.while_loop` of `keras.layers.RNN`).
        """
        self._num_draws += 1
        self.call_weights(add_losses=False)
        draws = {name: getattr(self, name) for name in self._random_weight_names}
        sequence = _Sequence(draws, self.next_seed(), batch_size)
        if sequence.graph is not None:
            sequence.formed = self._form(sequence, steps=True, losses=True)
        object.__setattr__(self, "_sequence", sequence)

    def _form(self, sequence, steps, losses):
        """`(projections, bias, kl_terms)`: the sequence's weights from the variables' values
        now; the step maps only with `steps`, the KL terms only with `losses` (else None)."""
        with sampling.reuse_draws(sequence.noise):
            self.set_kl_priors(losses)
            for name, rv in sequence.draws.items():
                setattr(self, name, getattr(self, f"{name}_initializer").redraw(rv))
            projections, bias = self._projections(sequence) if steps else (None, None)
            kl_terms = self.weight_kl_terms() if losses else None
        return projections, bias, kl_terms

    def _projections(self, sequence):
        """`({"kernel": x -> x W, "recurrent_kernel": h -> h U}, bias)` under the current draw."""
        kernel_seed, recurrent_seed = tfp.random.split_seed(sequence.seed, n=2)
        projections = {
            name: self.kernel_fn(name, batch_size=sequence.batch_size, seed=seed)
            for name, seed in (("kernel", kernel_seed), ("recurrent_kernel", recurrent_seed))
        }
        bias = tf.convert_to_tensor(self.bias) if self.use_bias else None
        return projections, bias

    def _current_sequence(self, batch_size=None):
        """The sequence's `(projections, bias, losses)` for this context; with `batch_size` (a
        step) a sequence drawn in an unrelated graph is replaced by a new one."""
        sequence = self._sequence
        if sequence is not None and batch_size is not None and sequence.is_stale():
            sequence = None
        if sequence is None:
            if batch_size is None:
                return None
            self.begin_sequence(batch_size)
            sequence = self._sequence
        if sequence.formed is not None and not sequence.in_own_graph():
            return sequence.formed
        step = batch_size is not None
        return self._form(sequence, steps=step, losses=not step)

    def _get_own_losses(self):
        own = super()._get_own_losses()
        current = self._current_sequence()
        return own + list(current[2]) if current is not None else own

    # Called in a user's `tf.function` (the paper's Figure 1), autograph would convert it and
    # everything it calls (the build, the draw) on each trace: seconds, for Python-only control
    # flow.
    @tf.autograph.experimental.do_not_convert
    def get_initial_state(self, inputs=None, batch_size=None):
        """Zero states for a batch, drawing the sequence's weights. `inputs` (a tensor whose
        first axis is the batch, as in the paper's Figure 1) or `batch_size`. An unbuilt cell
        given only `batch_size` (as `keras.layers.LSTMCell` allows) draws at its first step."""
        if inputs is not None and not isinstance(inputs, int):
            batch_size = tf.shape(inputs)[0]
        elif inputs is not None:
            batch_size = inputs
        if batch_size is None:
            raise ValueError(f"{type(self).__name__}.get_initial_state needs inputs or batch_size.")
        features = None
        if inputs is not None and not isinstance(inputs, int):
            features = inputs.shape[-1]
        if not self.built and features is not None:
            # The paper's Figure 1 asks for the state before the first call.
            self.build((None, int(features)))
        if self.built:
            self.begin_sequence(batch_size)
        else:
            object.__setattr__(self, "_sequence", None)
        return [
            tf.zeros(tf.stack([batch_size, self.units]), self.compute_dtype)
            for _ in range(self._num_states)
        ]

    def _linear(self, inputs, kernel):
        return dense_matmul(inputs, kernel)

    def call(self, inputs, states, training=None):
        projections, bias, _ = self._current_sequence(tf.shape(inputs)[0])
        h_prev = states[0] if isinstance(states, (list, tuple)) else states
        x_proj = projections["kernel"](inputs)
        h_proj = projections["recurrent_kernel"](h_prev)
        return self._gates(x_proj, h_proj, bias, states)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "activation": keras.activations.serialize(self.activation),
            "recurrent_activation": keras.activations.serialize(self.recurrent_activation),
            "use_bias": self.use_bias,
            "implementation": self.implementation,
            **self._weight_config("kernel"),
            **self._weight_config("recurrent_kernel", "recurrent"),
            **self._weight_config("bias"),
        }


class _LSTMCell(_CellBase):
    gates, _num_states = 4, 2

    def __init__(self, units, unit_forget_bias=True, **kwargs):
        self.unit_forget_bias = unit_forget_bias
        super().__init__(units, **kwargs)
        if unit_forget_bias and isinstance(self.bias_initializer, keras.initializers.Zeros):
            self.bias_initializer = _ForgetBiasOnes(units)

    @property
    def state_size(self):
        return [self.units, self.units]

    @property
    def output_size(self):
        return self.units

    def _gates(self, x_proj, h_proj, bias, states):
        z = x_proj + h_proj
        if bias is not None:
            z = z + bias
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
        i, f, o = (self.recurrent_activation(v) for v in (z_i, z_f, z_o))
        c = f * states[1] + i * self.activation(z_c)
        h = o * self.activation(c)
        return h, [h, c]

    def get_config(self):
        config = {**super().get_config(), "unit_forget_bias": self.unit_forget_bias}
        if isinstance(self.bias_initializer, _ForgetBiasOnes):
            config["bias_initializer"] = "zeros"
        return config


class _ForgetBiasOnes(keras.initializers.Initializer):
    """Zeros except ones for the forget gate (Jozefowicz et al., 2015), as Keras' LSTMCell."""

    def __init__(self, units):
        self.units = units

    def __call__(self, shape, dtype=None):
        zeros = tf.zeros([self.units], dtype or "float32")
        # A rank-1 cell's per-member bias `[E, 4 units]` gets the same row for every member.
        return tf.broadcast_to(tf.concat([zeros, tf.ones_like(zeros), zeros, zeros], 0), shape)

    def get_config(self):
        return {"units": self.units}


class _GRUCell(_CellBase):
    gates, _num_states = 3, 1

    @property
    def state_size(self):
        return self.units

    @property
    def output_size(self):
        return self.units

    def _bias_shape(self):
        return (2, 3 * self.units)  # input and recurrent biases (reset_after=True)

    def call(self, inputs, states, training=None):
        h, new_states = super().call(inputs, states, training)
        return h, new_states[0] if not isinstance(states, (list, tuple)) else new_states

    def _gates(self, x_proj, h_proj, bias, states):
        if bias is not None:
            x_proj, h_proj = x_proj + bias[0], h_proj + bias[1]
        x_z, x_r, x_h = tf.split(x_proj, 3, axis=-1)
        h_z, h_r, h_h = tf.split(h_proj, 3, axis=-1)
        z = self.recurrent_activation(x_z + h_z)
        r = self.recurrent_activation(x_r + h_r)
        candidate = self.activation(x_h + r * h_h)
        h_prev = states[0] if isinstance(states, (list, tuple)) else states
        h = z * h_prev + (1.0 - z) * candidate
        return h, [h]


@register
class LSTMCellReparameterization(ReparameterizationEstimator, _LSTMCell):
    """Bayesian LSTM cell: kernel and recurrent kernel drawn once per sequence."""


@register
class LSTMCellFlipout(FlipoutEstimator, _LSTMCell):
    """Bayesian LSTM cell, Flipout: one perturbation and per-example signs per sequence."""


@register
class GRUCellReparameterization(ReparameterizationEstimator, _GRUCell):
    """Bayesian GRU cell (reset_after=True): weights drawn once per sequence."""


@register
class GRUCellFlipout(FlipoutEstimator, _GRUCell):
    """Bayesian GRU cell, Flipout: one perturbation and per-example signs per sequence."""
