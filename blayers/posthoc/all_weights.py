"""Post-hoc Laplace approximation over all the weights of a trained Keras model (Ritter et al.,
2018; Immer et al., 2021; Daxberger et al., 2021, "Laplace Redux").

Every `keras.layers.Dense`, `Conv1D` and `Conv2D` layer `l` is a linear map of its unfolded
inputs: with `a_t` the layer's input at location `t` (a patch for a convolution, with a 1 for the
bias) and `Theta_l = [W; b]`, its pre-activation is `s_t = Theta_l^T a_t`. Around the trained
weights `theta*` and under the prior `N(0, I / delta)` the posterior is `N(theta*, P^-1)`, with
`P` block-diagonal over layers, each block `H_l + delta I` of the generalized Gauss-Newton
matrix of the NLL

    H_l = sum_n J_ln^T Lambda_n J_ln,   J_ln = d f_n / d theta_l = sum_t a_nt (x) g_nt,

`g_nt = d f_n / d s_nt` the backpropagated output Jacobian and `Lambda_n` the likelihood's
curvature in the outputs (`diag(p) - p p^T` for a softmax). `hessian_structure` picks how `H_l`
is kept:

* `'kron'`: KFAC (Martens & Grosse, 2015; Grosse & Martens, 2016 for convolutions, locations
  and repeated calls of a layer read as extra examples),
  `H_l ~ (1/(N T)) sum_nt a a^T  (x)  sum_nt g~ g~^T` with `g~ = g L_n`, `L_n L_n^T = Lambda_n`.
  It is exact for one example of a dense layer.
* `'diag'`: the exact diagonal of the GGN.

The predictive linearizes the network around `theta*` (the GLM predictive of Immer et al.,
2021): `f(x) ~ N(f*(x), sum_l J_l P_l^-1 J_l^T)`, then the probit approximation or Monte Carlo
for classification; or, with `pred_type='nn'`, it averages the network itself over weights
drawn from the posterior. Trainable weights of other layers (normalization, embeddings) are kept
at their trained values: they are listed in `point_estimated`. `to_model` makes the linearized
predictive one Keras model (`AllWeightsLaplacePredictive`) to save as a `.keras` file.
"""

import contextlib
import math

import keras
import numpy as np
import scipy.optimize
import tensorflow as tf
from scipy.special import softmax

from blayers.posthoc.batches import batches, input_batches
from blayers.posthoc.laplace_base import (
    _LaplaceBase,
    precision_eigenvalues,
    probit_or_gaussian,
)

__all__ = ["AllWeightsLaplace", "AllWeightsLaplacePredictive"]

_KINDS = {keras.layers.Conv1D: 1, keras.layers.Conv2D: 2, keras.layers.Dense: 0}


def _kind(layer):
    for cls, rank in _KINDS.items():
        if isinstance(layer, cls):
            return rank
    return None


class _Block:
    """One dense or convolutional layer as the matrix `Theta = [W; b]` of shape
    `[P (+1), C_out]`, with its inputs unfolded to `a [n, T, P (+1)]`."""

    def __init__(self, layer, rank):
        self.layer, self.rank = layer, rank
        name = f"{layer.name!r} ({type(layer).__name__})"
        if rank:
            if getattr(layer, "groups", 1) != 1:
                raise ValueError(f"AllWeightsLaplace: layer {name} has groups > 1.")
            if layer.data_format != "channels_last":
                raise ValueError(f"AllWeightsLaplace: layer {name} is not channels_last.")
            if layer.padding not in ("valid", "same"):
                raise ValueError(
                    f"AllWeightsLaplace: layer {name} has padding {layer.padding!r}; "
                    "'valid' and 'same' are supported."
                )
        elif len(layer.kernel.shape) != 2:
            raise ValueError(f"AllWeightsLaplace: layer {name} does not have a 2-D kernel.")
        self.has_bias = getattr(layer, "bias", None) is not None
        self.kernel_shape = tuple(layer.kernel.shape)

    def weights(self):
        kernel = np.asarray(keras.ops.convert_to_numpy(self.layer.kernel), np.float64)
        kernel = kernel.reshape(-1, self.kernel_shape[-1])
        if not self.has_bias:
            return kernel
        bias = np.asarray(keras.ops.convert_to_numpy(self.layer.bias), np.float64)
        return np.concatenate([kernel, bias[None]], 0)

    def variables(self):
        return [self.layer.kernel, self.layer.bias] if self.has_bias else [self.layer.kernel]

    def values(self, theta):
        """The layer's kernel (and bias) of `theta`, in their shapes and dtypes."""
        kernel = theta[: -1 if self.has_bias else None].reshape(self.kernel_shape)
        values = [kernel.astype(self.layer.kernel.dtype)]
        if self.has_bias:
            values.append(theta[-1].astype(self.layer.bias.dtype))
        return values

    def assign(self, theta):
        for variable, value in zip(self.variables(), self.values(theta), strict=True):
            variable.assign(value)

    def unfold(self, inputs, dtype):
        """`a [n, T, P (+1)]` of `dtype`: the inputs each output location sees, in the
        kernel's order."""
        x = tf.convert_to_tensor(inputs)
        if self.rank == 0:
            a = tf.reshape(x, [tf.shape(x)[0], -1, x.shape[-1]])
        else:
            layer = self.layer
            if self.rank == 1:
                x = x[:, None]
            size = (1,) * (2 - self.rank) + tuple(layer.kernel_size)
            strides = (1,) * (2 - self.rank) + tuple(layer.strides)
            rates = (1,) * (2 - self.rank) + tuple(layer.dilation_rate)
            a = tf.image.extract_patches(
                x,
                sizes=[1, *size, 1],
                strides=[1, *strides, 1],
                rates=[1, *rates, 1],
                padding=layer.padding.upper(),
            )
            a = tf.reshape(a, [tf.shape(a)[0], -1, a.shape[-1]])
        a = tf.cast(a, dtype)
        if self.has_bias:
            a = tf.concat([a, tf.ones_like(a[..., :1])], -1)
        return a


@contextlib.contextmanager
def _recording(blocks, watch):
    """Records each block's inputs and pre-activations (every call) during a forward pass;
    `watch` (a tape's) sees each pre-activation, so Jacobians reach it even from frozen
    weights."""
    records = {id(b.layer): [] for b in blocks}
    saved = []
    for block in blocks:
        layer = block.layer
        call, activation = layer.call, layer.activation
        calls = records[id(layer)]

        def recorded_call(inputs, *args, _call=call, _calls=calls, **kwargs):
            _calls.append({"a": inputs})
            return _call(inputs, *args, **kwargs)

        def recorded_activation(s, _activation=activation, _calls=calls):
            watch(s)
            _calls[-1]["s"] = s
            return _activation(s) if _activation is not None else s

        saved.append((layer, activation))
        layer.call, layer.activation = recorded_call, recorded_activation
    try:
        yield records
    finally:
        for layer, activation in saved:
            del layer.__dict__["call"]
            layer.activation = activation


def _jacobian_pass(model, blocks, last, x, dtype):
    """One forward pass of `model` on `x`: its output, the last layer's pre-activations `f`
    and, per block, the unfolded inputs `a [n, T, P (+1)]` and output Jacobians
    `g [n, K, T, C]` of `dtype` (calls of a shared layer stacked along `T`)."""
    # Under an outer scope: a traced call of a model named `_...` is not a valid root scope.
    with (
        tf.GradientTape(persistent=True) as tape,
        _recording(blocks, tape.watch) as records,
        tf.name_scope("laplace"),
    ):
        output = model(x, training=False)
    if not records[id(last)]:
        raise ValueError(
            f"AllWeightsLaplace: the last layer {last.name!r} was not called by the model's "
            "forward pass."
        )
    logits = records[id(last)][-1]["s"]
    n, k = tf.shape(logits)[0], logits.shape[-1]
    parts = []
    for block in blocks:
        calls = records[id(block.layer)]
        if not calls:
            raise ValueError(
                f"AllWeightsLaplace: layer {block.layer.name!r} is not used by the model's "
                "forward pass; pass exclude=[its name]."
            )
        a = tf.concat([block.unfold(c["a"], dtype) for c in calls], 1)
        g = tf.concat(
            [
                tf.reshape(
                    tf.cast(tape.batch_jacobian(logits, c["s"]), dtype),
                    [n, k, -1, c["s"].shape[-1]],
                )
                for c in calls
            ],
            2,
        )
        parts.append((a, g))
    del tape
    return output, logits, parts


def _eigenbasis_parts(ops, structure, state, a, g):
    """A block's Jacobian in the posterior's eigenbasis, from `a [n, T, P]` and
    `g [n, K, T, C]`: `(a, g)` apart for a layer seen once per example (`J = a (x) g`, never
    formed), else `(J [n, K, P, C],)`; `ops` NumPy or `keras.ops`."""
    if structure == "kron":
        a = ops.matmul(a, state["vectors_a"])
        g = ops.matmul(g, state["vectors_g"])
    if a.shape[1] == 1:
        return a[:, 0], g[:, :, 0]
    return (ops.einsum("nti,nkto->nkio", a, g),)


def _block_covariance(ops, parts, inverse):
    """One block's `J P^-1 J^T [n, K, K]` from `_eigenbasis_parts`, with `inverse [P, C]` the
    precision's inverse eigenvalues."""
    if len(parts) == 2:
        a, g = parts
        return ops.einsum("nko,no,nlo->nkl", g, ops.matmul(ops.square(a), inverse), g)
    return ops.einsum("nkio,nlio,io->nkl", parts[0], parts[0], inverse)


# Posterior draws the network runs on in one graph call of `predict(pred_type='nn')`.
_DRAWS_A_CALL = 256


class AllWeightsLaplace(_LaplaceBase):
    """A Laplace approximation over the weights of every dense and convolutional layer.

    Made by `Laplace(model, ..., subset_of_weights='all')`, or directly.

    Args:
      model: a trained `keras.Model` (functional, sequential or subclassed) whose output is its
        last layer's, a dense layer with a linear activation (for classification its outputs are
        logits; a softmax activation is read as logits).
      likelihood: `'classification'` (softmax, integer labels) or `'regression'` (Gaussian with
        noise stddev `sigma_noise`).
      hessian_structure: `'kron'` (KFAC) or `'diag'` (see the module's docstring); `'full'` is
        for the last layer only.
      prior_precision: `delta` of the prior `N(0, I / delta)` on the weights, or one a covered
        layer (a per-layer prior, in the order of `blocks`; `optimize_prior_precision(
        layerwise=True)` fits one a layer by the evidence).
      sigma_noise: the regression's noise standard deviation.
      dtype: `'float64'` (default) or `'float32'` for the accumulated curvature (the network's
        Jacobians are computed in its own dtype).
      exclude: names of dense or convolutional layers to keep at their trained values.
    """

    structures = ("kron", "diag")

    def __init__(
        self,
        model,
        likelihood="classification",
        hessian_structure="kron",
        prior_precision=1.0,
        sigma_noise=1.0,
        dtype="float64",
        exclude=(),
    ):
        if hessian_structure == "full":
            raise ValueError(
                "AllWeightsLaplace: hessian_structure 'full' is for the last layer only; over all "
                "weights use 'kron' or 'diag'."
            )
        layers = [
            layer
            for layer in model._flatten_layers(include_self=False, recursive=True)
            if layer.trainable and layer.name not in exclude and _kind(layer) is not None
        ]
        self._cover(model, layers)  # first: a per-layer prior precision is checked against it
        self._init_common(likelihood, hessian_structure, prior_precision, sigma_noise, dtype)

    def _cover(self, model, layers):
        """Puts the posterior on `layers` (dense and convolutional layers of `model`)."""
        self.model = model
        self.last = model.layers[-1]
        self._check_last_layer(self.last)
        self.blocks = [_Block(layer, _kind(layer)) for layer in layers]
        if not any(block.layer is self.last for block in self.blocks):
            raise ValueError(
                f"AllWeightsLaplace: the last layer {self.last.name!r} is excluded or frozen."
            )
        covered = {id(v) for block in self.blocks for v in block.layer.trainable_weights}
        self.point_estimated = [v.path for v in model.trainable_weights if id(v) not in covered]
        self._output_checked = False

    # ----------------------------------------------------------------------------------------
    # A forward pass with the Jacobians the curvature and the predictive need.

    def _forward(self, x):
        """`f [n, K]` (the logits or means) and, per block, `a [n, T, P]` and the output
        Jacobian `g [n, K, T, C]` (calls of a shared layer stacked along `T`), as NumPy."""
        x = tf.nest.map_structure(tf.convert_to_tensor, x)
        if getattr(self, "_traced", None) is None:
            # One traced pass for every batch: eager batch_jacobian would retrace each call.
            self._traced = tf.function(
                lambda x: _jacobian_pass(self.model, self.blocks, self.last, x, self.dtype.name),
                reduce_retracing=True,
                autograph=False,
            )
            # Traced once for any batch size: a last, smaller batch (or the predictive's
            # inputs) takes the same graph instead of a second trace.
            self._traced.get_concrete_function(
                tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), x)
            )
        output, logits, parts = self._traced(x)
        if not self._output_checked:
            if (
                len(logits.shape) != 2
                or tuple(output.shape) != tuple(logits.shape)
                or not np.allclose(self.last.activation(logits), output, atol=1e-5)
            ):
                raise ValueError(
                    f"AllWeightsLaplace: the model's output {tuple(output.shape)} is not computed "
                    f"by its last layer {self.last.name!r} as [batch, outputs] (a subclassed "
                    "model lists its layers in the order it creates them: create the output "
                    "layer last)."
                )
            self._output_checked = True
        parts = [(a.numpy(), g.numpy()) for a, g in parts]
        return np.asarray(logits.numpy(), np.float64), parts

    def fit(self, data, batch_size=256, progress=False):
        """Accumulates the curvature over `data`: a `tf.data.Dataset` of `(x, y)` batches or a
        pair of arrays `(x, y)`, with a progress bar if `progress`. Returns `self`."""
        self._output_checked = False
        self.thetas = [block.weights() for block in self.blocks]
        shapes = [theta.shape for theta in self.thetas]
        if self.structure == "kron":
            factors = [
                [np.zeros((p, p), self.dtype), np.zeros((c, c), self.dtype), 0] for p, c in shapes
            ]
        else:
            diagonals = [np.zeros(shape, self.dtype) for shape in shapes]
        self._start_fit()
        bar = keras.utils.Progbar(None, unit_name="batch") if progress else None
        for x, y in batches(data, batch_size):
            f, parts = self._forward(x)
            root = self._output_curvature_root(f).astype(self.dtype)
            for i, (a, g) in enumerate(parts):
                g_root = np.einsum("nkc,nkto->ncto", root, g)
                if self.structure == "kron":
                    factors[i][0] += np.einsum("nti,ntj->ij", a, a)
                    factors[i][1] += np.einsum("ncto,nctp->op", g_root, g_root)
                    factors[i][2] += a.shape[0] * a.shape[1]
                else:
                    diagonals[i] += np.sum(
                        np.square(np.einsum("nti,ncto->ncio", a, g_root)), (0, 1)
                    )
            self._accumulate_fit(f, np.asarray(y))
            self.num_data += len(f)
            if bar is not None:
                bar.add(1)
        if self.num_data == 0:
            raise ValueError("AllWeightsLaplace.fit: the data held no examples.")
        self.num_outputs = f.shape[1]
        if self.structure == "kron":
            self._states = []
            for factor_a, factor_g, count in factors:
                s_a, u_a = np.linalg.eigh(factor_a.astype(np.float64) / count)
                s_g, u_g = np.linalg.eigh(factor_g.astype(np.float64))
                self._states.append(
                    {"values_a": s_a, "vectors_a": u_a, "values_g": s_g, "vectors_g": u_g}
                )
        else:
            self._states = [{"diag_h": d.reshape(-1).astype(np.float64)} for d in diagonals]
        self.fitted = True
        return self

    # ----------------------------------------------------------------------------------------
    # The posterior.

    def _map_vector(self):
        return np.concatenate([theta.reshape(-1) for theta in self.thetas])

    # The output curvature enters every layer's G factor: per-output noise would change them.
    per_output_noise_structures = ()

    def _checked_precision(self, prior_precision):
        if np.ndim(prior_precision) == 0:
            return super()._checked_precision(prior_precision)
        deltas = np.asarray(prior_precision, np.float64).reshape(-1)
        if len(deltas) != len(self.blocks) or not np.all(deltas > 0):
            raise ValueError(
                f"AllWeightsLaplace: per-layer prior_precision needs one positive number a "
                f"covered layer ({len(self.blocks)}: {[b.layer.name for b in self.blocks]}), got "
                f"{prior_precision!r}."
            )
        return deltas

    def _deltas(self, prior_precision):
        """The prior precision of each block."""
        return np.broadcast_to(np.asarray(prior_precision, np.float64), (len(self.blocks),))

    def _prior_terms(self, delta):
        quadratic = log_delta = 0.0
        for d, theta in zip(self._deltas(delta), self.thetas, strict=True):
            quadratic += d * float(np.sum(theta**2))
            log_delta += theta.size * math.log(d)
        return quadratic, log_delta

    def optimize_prior_precision(self, method="marglik", val_data=None, grid=None, layerwise=False):
        """As `Laplace.optimize_prior_precision`; with `layerwise=True` (evidence only), one
        precision a covered layer, maximizing the evidence jointly (with the noise, for
        regression) by L-BFGS over their logarithms. Returns the prior precision."""
        if not layerwise:
            return super().optimize_prior_precision(method, val_data, grid)
        if method != "marglik":
            raise ValueError(
                "AllWeightsLaplace: layerwise prior precisions are fitted by 'marglik'."
            )
        self._check_fitted()
        count = len(self.blocks)
        regression = self.likelihood == "regression"
        start = np.log(self._deltas(self.prior_precision))
        if regression:
            start = np.r_[start, math.log(self.sigma_noise)]

        def objective(params):
            sigma = math.exp(params[count]) if regression else None
            return -self.log_marginal_likelihood(np.exp(params[:count]), sigma)

        bounds = [(-12.0, 12.0)] * len(start)
        result = scipy.optimize.minimize(objective, start, method="L-BFGS-B", bounds=bounds)
        self.prior_precision = np.exp(result.x[:count])
        if regression:
            self.sigma_noise = float(math.exp(result.x[count]))
        return self.prior_precision

    def _block_eigenvalues(self, prior_precision, sigma_noise):
        scale = self._curvature_scale(sigma_noise)
        return [
            precision_eigenvalues(np, self.structure, state, float(delta), scale).reshape(
                theta.shape
            )
            for state, theta, delta in zip(
                self._states, self.thetas, self._deltas(prior_precision), strict=True
            )
        ]

    def _precision_eigenvalues(self, prior_precision, sigma_noise):
        return np.concatenate(
            [e.reshape(-1) for e in self._block_eigenvalues(prior_precision, sigma_noise)]
        )

    def _cache(self, x, batch_size=256):
        """`f*` and, per block, the Jacobians in the posterior's eigenbasis: `(a, g)` apart for
        a layer seen once per example (`J = a (x) g`), else `J [n, K, P, C]`."""
        fs, blocks = [], [[] for _ in self.blocks]
        for batch in input_batches(x, batch_size):
            f, parts = self._forward(batch)
            fs.append(f)
            for i, (a, g) in enumerate(parts):
                blocks[i].append(_eigenbasis_parts(np, self.structure, self._states[i], a, g))
        merged = [tuple(np.concatenate(arrays) for arrays in zip(*parts)) for parts in blocks]
        return np.concatenate(fs), merged

    def _moments(self, cache):
        f, blocks = cache
        inverses = self._block_eigenvalues(self.prior_precision, self.sigma_noise)
        cov = np.zeros((*f.shape, f.shape[1]))
        for parts, eigenvalues in zip(blocks, inverses, strict=True):
            cov += _block_covariance(np, parts, 1.0 / eigenvalues)
        return f, cov

    # ----------------------------------------------------------------------------------------
    # Predictions and samples.

    def predict(self, x, link_approx="probit", num_samples=100, seed=0, pred_type="glm"):
        """The predictive of inputs `x`.

        `pred_type='glm'`: the linearized network's Gaussian over the outputs, then (for
        classification) the probit approximation or a Monte Carlo average of `softmax(f)`
        (`link_approx='probit'|'mc'`). `pred_type='nn'`: the network averaged over
        `num_samples` weight draws from the posterior. Classification returns class
        probabilities `[n, K]`; regression `(mean, stddev)`.
        """
        self._check_fitted()
        if pred_type == "glm":
            return self._predictive(self._cache(x), link_approx, num_samples, seed)
        if pred_type != "nn":
            raise ValueError(f"AllWeightsLaplace: pred_type {pred_type!r} is not 'glm' or 'nn'.")
        draws = self.sample(num_samples, seed)
        forward = self._draw_forward()
        batches_of_x = list(input_batches(x, 256))

        def values(s):  # draw s's kernels and biases, in the order of `_draw_forward`
            return [
                value
                for block, theta in zip(self.blocks, draws, strict=True)
                for value in block.values(theta[s])
            ]

        outputs = []
        try:
            for start in range(0, num_samples, _DRAWS_A_CALL):
                chunk = range(start, min(start + _DRAWS_A_CALL, num_samples))
                stacked = [np.stack(column) for column in zip(*map(values, chunk), strict=True)]
                outputs.append(
                    np.concatenate([forward(stacked, batch).numpy() for batch in batches_of_x], 1)
                )
        finally:
            for block, theta in zip(self.blocks, self.thetas, strict=True):
                block.assign(theta)
        outputs = np.concatenate(outputs).astype(np.float64)
        if self.likelihood == "regression":
            mean = outputs.mean(0)
            return mean, np.sqrt(outputs.var(0) + self.sigma_noise**2)
        softmax_output = getattr(self.last.activation, "__name__", "") == "softmax"
        return (outputs if softmax_output else softmax(outputs, -1)).mean(0)

    def _draw_forward(self):
        """`forward(stacked, batch) -> [S, n, K]`: for each of `S` draws (`stacked`: the blocks'
        kernels and biases, in order, each `[S, ...]`) the blocks' weights set to it and the
        network run on `batch`, all in one graph call (a call a draw spent milliseconds of
        eager overhead each on thousands of draws); traced once an instance."""
        if getattr(self, "_nn_forward", None) is None:
            variables = [v for block in self.blocks for v in block.variables()]
            model = self.model
            dtype = tf.as_dtype(self.last.compute_dtype)

            def one_draw(batch, values):
                assigned = [v.assign(value) for v, value in zip(variables, values, strict=True)]
                with tf.control_dependencies(assigned):
                    return tf.cast(model(batch, training=False), dtype)

            @tf.function(autograph=False, reduce_retracing=True)
            def forward(stacked, batch):
                # One draw at a time: each sets the shared variables the next one overwrites.
                return tf.map_fn(
                    lambda values: one_draw(batch, values),
                    stacked,
                    parallel_iterations=1,
                    fn_output_signature=dtype,
                )

            self._nn_forward = forward
        return self._nn_forward

    def sample(self, num_samples, seed=0):
        """Draws of each block's `[P (+1), C]` weights, a list over blocks of
        `[num_samples, P (+1), C]` arrays."""
        self._check_fitted()
        rng = np.random.default_rng(seed)
        draws = []
        for state, theta, eigenvalues in zip(
            self._states,
            self.thetas,
            self._block_eigenvalues(self.prior_precision, self.sigma_noise),
            strict=True,
        ):
            eps = rng.normal(size=(num_samples, *theta.shape)) / np.sqrt(eigenvalues)
            if self.structure == "kron":
                eps = np.einsum("ia,sab,ob->sio", state["vectors_a"], eps, state["vectors_g"])
            draws.append(theta + eps)
        return draws

    # ----------------------------------------------------------------------------------------
    # Saving.

    def save(self, path):
        """Writes the fitted posterior to an `.npz` file, read back over the same trained model
        by `load` (`to_model` makes one `.keras` file of the network and its posterior)."""
        self._check_fitted()
        arrays = {
            f"block{i}/{key}": value
            for i, state in enumerate(self._states)
            for key, value in state.items()
        }
        scalars = _scalars(self)
        deltas = np.asarray(scalars.pop("prior_precision"), np.float64).reshape(-1)
        np.savez(
            path,
            **arrays,
            names=np.array([block.layer.name for block in self.blocks]),
            prior_precisions=deltas,  # one, or one a layer
            scalars=np.array([np.nan, *scalars.values()]),
            likelihood=np.array(self.likelihood),
            structure=np.array(self.structure),
        )

    @classmethod
    def load(cls, path, model):
        """The posterior `save` wrote, over `model` (the same trained model)."""
        with np.load(path) as saved:
            names = [str(n) for n in saved["names"]]
            structure = str(saved["structure"])
            states = [
                {key: saved[f"block{i}/{key}"] for key in _STATE_KEYS[structure]}
                for i in range(len(names))
            ]
            scalars = dict(zip(_SCALARS, saved["scalars"].tolist(), strict=True))
            if "prior_precisions" in saved:
                deltas = saved["prior_precisions"]
                scalars["prior_precision"] = float(deltas[0]) if deltas.size == 1 else deltas
            likelihood = str(saved["likelihood"])
        return cls._restored(model, likelihood, structure, names, scalars, states, str(path))

    @classmethod
    def _restored(cls, model, likelihood, structure, names, scalars, states, source):
        """A fitted posterior over `model` from its saved parts (`source` names them in errors)."""
        self = cls.__new__(cls)
        self._cover(model, _named_layers(model, names, source))
        self._init_common(
            likelihood, structure, scalars["prior_precision"], scalars["sigma_noise"], "float64"
        )
        self.num_data = int(scalars["num_data"])
        self.log_likelihood_sum, self.sse = (
            float(scalars["log_likelihood_sum"]),
            float(scalars["sse"]),
        )
        self._states = [
            {key: np.asarray(value, np.float64) for key, value in state.items()} for state in states
        ]
        self.thetas = [block.weights() for block in self.blocks]
        self.num_outputs = self.thetas[-1].shape[1]
        self._output_checked = False
        self.fitted = True
        return self

    def to_model(self, link_approx="probit"):
        """The linearized predictive as a `keras.Model` (an `AllWeightsLaplacePredictive`: the
        trained network inside, the posterior in its weights), to save as one `.keras` file.
        `keras.models.load_model` reads it back after `import blayers.posthoc` (the network
        must be serializable itself: functional, sequential, or a registered subclass with a
        `get_config`), and `AllWeightsLaplace.from_model` turns it into an `AllWeightsLaplace`
        again."""
        self._check_fitted()
        if link_approx != "probit":
            raise ValueError(
                "AllWeightsLaplace.to_model: the saved predictive uses link_approx='probit'."
            )
        predictive = AllWeightsLaplacePredictive(
            self.model,
            likelihood=self.likelihood,
            hessian_structure=self.structure,
            layer_names=[block.layer.name for block in self.blocks],
            **_scalars(self),
            name=f"{self.model.name.lstrip('_')}_laplace",  # a scope name cannot start with _
        )
        predictive.set_state(self._states)
        return predictive

    @classmethod
    def from_model(cls, predictive):
        """The fitted `AllWeightsLaplace` held by a model from `to_model` (e.g. one just
        loaded)."""
        if not isinstance(predictive, AllWeightsLaplacePredictive):
            raise TypeError(
                f"AllWeightsLaplace.from_model: {getattr(predictive, 'name', predictive)!r} is "
                "not an AllWeightsLaplacePredictive (make it with AllWeightsLaplace.to_model)."
            )
        return cls._restored(
            predictive.network,
            predictive.likelihood,
            predictive.hessian_structure,
            predictive.layer_names,
            predictive.scalars(),
            predictive.state(),
            f"predictive {predictive.name!r}",
        )


_SCALARS = ("prior_precision", "sigma_noise", "num_data", "log_likelihood_sum", "sse")


def _scalars(posterior):
    """What a saved posterior keeps besides its arrays, by name (per-layer precisions as a
    list)."""
    values = {name: getattr(posterior, name) for name in _SCALARS}
    if np.ndim(values["prior_precision"]):
        values["prior_precision"] = [float(d) for d in values["prior_precision"]]
    return values


_STATE_KEYS = {
    "kron": ("values_a", "vectors_a", "values_g", "vectors_g"),
    "diag": ("diag_h",),
}


def _named_layers(model, names, source):
    """The dense and convolutional layers of `model` a saved posterior (`source`) names."""
    layers = {layer.name: layer for layer in model._flatten_layers(include_self=False)}
    unusable = [name for name in names if _kind(layers.get(name)) is None]
    if unusable:
        raise ValueError(
            f"AllWeightsLaplace: {source} holds layers {names}; the model {model.name!r} has no "
            f"dense or convolutional layers {unusable}."
        )
    return [layers[name] for name in names]


def _state_shapes(structure, block):
    """Each fitted array's shape for a block whose `Theta` is `[P (+1), C]`."""
    p = int(np.prod(block.kernel_shape[:-1])) + int(block.has_bias)
    c = block.kernel_shape[-1]
    if structure == "kron":
        return {"values_a": (p,), "vectors_a": (p, p), "values_g": (c,), "vectors_g": (c, c)}
    return {"diag_h": (p * c,)}


@keras.saving.register_keras_serializable("blayers")
class AllWeightsLaplacePredictive(keras.Model):
    """The linearized (GLM) predictive of a fitted `AllWeightsLaplace` as a Keras model of the
    network's inputs (made by `AllWeightsLaplace.to_model`; the network and its posterior are
    saved together).

    Each call runs the network once, records every covered layer's unfolded inputs `a` and
    the output Jacobians `g` of its pre-activations, and sums the blocks' covariances
    `Sigma_f = sum_l J_l P_l^-1 J_l^T`, `J_l = sum_t a_t (x) g_t`, in the posterior's
    eigenbasis (float64). Classification returns the probit-approximated class probabilities
    `softmax(f* / sqrt(1 + pi/8 diag(Sigma_f)))`; regression `(mean, stddev)` with
    `stddev^2 = diag(Sigma_f) + sigma_noise^2`. The Jacobians need the TensorFlow backend.

    Args:
      model: the trained `keras.Model` the posterior is over (a serialized one when loading).
      likelihood: `'classification'` or `'regression'`.
      hessian_structure: `'kron'` or `'diag'`.
      layer_names: the covered dense and convolutional layers, in the posterior's order.
      prior_precision, sigma_noise: as in `AllWeightsLaplace`.
      num_data, log_likelihood_sum, sse: the fit's statistics (for the evidence after loading).
      **kwargs: `keras.Model` arguments.
    """

    def __init__(
        self,
        model,
        likelihood="classification",
        hessian_structure="kron",
        layer_names=(),
        prior_precision=1.0,
        sigma_noise=1.0,
        num_data=0,
        log_likelihood_sum=0.0,
        sse=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if hessian_structure not in _STATE_KEYS:
            raise ValueError(
                f"AllWeightsLaplacePredictive: hessian_structure {hessian_structure!r} is not "
                "'kron' or 'diag'."
            )
        self.network = model
        self.likelihood, self.hessian_structure = likelihood, hessian_structure
        self.layer_names = list(layer_names)
        self.prior_precision = (
            float(prior_precision)
            if np.ndim(prior_precision) == 0
            else [float(d) for d in prior_precision]
        )
        self.sigma_noise = float(sigma_noise)
        self.num_data, self.log_likelihood_sum, self.sse = (
            int(num_data),
            float(log_likelihood_sum),
            float(sse),
        )
        layers = _named_layers(model, self.layer_names, f"predictive {self.name!r}")
        self._blocks = [_Block(layer, _kind(layer)) for layer in layers]
        self._last = model.layers[-1]
        self._variables = [
            {
                key: self.add_weight(
                    name=f"block{i}_{key}",
                    shape=shape,
                    initializer="zeros",
                    trainable=False,
                    dtype="float64",
                )
                for key, shape in _state_shapes(hessian_structure, block).items()
            }
            for i, block in enumerate(self._blocks)
        ]
        self.built = True

    def set_state(self, states):
        """Writes an `AllWeightsLaplace`'s fitted arrays (a list over blocks) into the weights."""
        for variables, state in zip(self._variables, states, strict=True):
            for key, variable in variables.items():
                variable.assign(np.asarray(state[key], np.float64))

    def state(self):
        """The fitted arrays, a list over blocks of NumPy dicts."""
        return [
            {key: np.asarray(keras.ops.convert_to_numpy(v)) for key, v in variables.items()}
            for variables in self._variables
        ]

    def scalars(self):
        """The prior precision, noise and the fit's statistics."""
        return _scalars(self)

    def call(self, inputs):
        _, logits, blocks = _jacobian_pass(
            self.network, self._blocks, self._last, inputs, "float64"
        )
        k = logits.shape[-1]
        scale = 1.0 / self.sigma_noise**2 if self.likelihood == "regression" else 1.0
        cov = tf.zeros([tf.shape(logits)[0], k, k], tf.float64)
        deltas = np.broadcast_to(np.asarray(self.prior_precision), (len(self._variables),))
        for (a, g), variables, delta in zip(blocks, self._variables, deltas, strict=True):
            state = {key: tf.convert_to_tensor(v) for key, v in variables.items()}
            inverse = 1.0 / tf.reshape(
                precision_eigenvalues(
                    keras.ops,
                    self.hessian_structure,
                    state,
                    float(delta),
                    scale,
                ),
                [a.shape[-1], g.shape[-1]],
            )
            parts = _eigenbasis_parts(keras.ops, self.hessian_structure, state, a, g)
            cov += _block_covariance(keras.ops, parts, inverse)
        return probit_or_gaussian(
            keras.ops, self.likelihood, tf.cast(logits, tf.float64), cov, self.sigma_noise
        )

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "model": keras.saving.serialize_keras_object(self.network),
            "likelihood": self.likelihood,
            "hessian_structure": self.hessian_structure,
            "layer_names": self.layer_names,
            **self.scalars(),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["model"] = keras.saving.deserialize_keras_object(config["model"])
        return cls(**config)
