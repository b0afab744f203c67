"""Probabilistic programs: log joints and variational inference over a model program and a
separate posterior program (Tran et al., 2019, Sec. 2.5 and Figure 8: "a clean separation of
model and inference"; Edward2's `make_log_joint_fn`, Tran et al., 2018).

A *program* is a Python callable that constructs random variables: `blayers.Normal(...,
name='z')`, blayers layers that return them (GP layers, stochastic output layers: named by
`output_name`, default the layer's name), `blayers.layers.PoissonProcess`. A variable is known by
its `name`.

* `make_log_joint(model)`: `log_joint(*args, **values) = sum_v log p(v | parents)` over every
  variable the program constructs, each set to `values[name]` (or to the value an outer
  `condition` gives it); a variable left without a value raises `LookupError` rather than
  entering at a random draw, and a value for a name the program lacks raises `KeyError`
  (both as edward2's `make_log_joint_fn`). Variables
  constructed while another's density is evaluated count too (the GP inside a `PoissonProcess`'s
  rate). It composes with `condition` and `tape` (their interceptors see every construction).
* `elbo(model, posterior, observed=...)`: `E_q[log p(x, z) - log q(z)]`, the posterior program's
  variables (`z`) sharing names with the model's latent ones, by Monte Carlo with
  reparameterization gradients; a variable whose distribution is not reparameterized (discrete)
  adds the score-function term `(log p - log q - b) grad log q(z)` with the leave-one-out
  baseline `b` over `num_samples` draws (Mnih and Rezende, 2016), an unbiased gradient.
* `VariationalProgram`: a Keras model whose call is `-ELBO` per observed unit, fitted by the
  trainer (`blayers.lab.tasks.VariationalInference` reads it as the loss). Model parameters (a GP's
  kernel hyperparameters) and variational parameters train together: variational EM.

A Bayesian layer in a *model* program is a function prior: give it an initializer that returns
the prior (`blayers.initializers.NormalPrior`) and no regularizer, and its weights are random
variables (`'<layer>/kernel'`) whose log density joins the log joint. Use the Reparameterization
estimator there: its forward pass uses the weight's draw, the one whose density is counted.
"""

import collections

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.random_variable import RandomVariable
from blayers.tracing import tape, trace, traceable, unique_key

tfd = tfp.distributions

__all__ = [
    "ELBO",
    "UnknownVariableError",
    "VariationalProgram",
    "elbo",
    "log_prob_terms",
    "make_log_joint",
    "make_log_joint_fn",
]


class UnknownVariableError(KeyError, ValueError):
    """A value for a name the program never constructs (a `KeyError`, as in edward2, and a
    `ValueError`)."""

    def __str__(self):
        return str(self.args[0])


def log_prob_terms(model, *args, values=None, require_values=False, **kwargs):
    """`OrderedDict name -> summed log density` of each variable `model(*args, **kwargs)`
    constructs, every one set to `values[name]` where given (else drawn); and the program's
    return value.

    Args:
      require_values: raise `LookupError` for a variable left without a value (neither in
        `values` nor given by an outer interceptor) instead of drawing it.

    Raises:
      UnknownVariableError: a name in `values` that the program never constructs (naming the
        ones it does).
      ValueError: a value whose shape does not fit its variable.
      LookupError: with `require_values`, the variables left without a value.
    """
    values = dict(values or {})
    terms = collections.OrderedDict()
    constructed = set()
    missing = []

    def interceptor(f, *f_args, **f_kwargs):
        name = f_kwargs.get("name")
        if name in values and f_kwargs.get("value") is None:
            f_kwargs["value"] = values[name]
        try:
            rv = traceable(f)(*f_args, **f_kwargs)  # outer interceptors (tape, condition) see it
        except ValueError as error:
            raise ValueError(f"make_log_joint: variable {name!r}: {error}") from error
        if not name:  # unnamed: known by its distribution's name
            name = rv.distribution.name
            if name in values and not rv.has_value:
                rv = RandomVariable(rv.distribution, rv.sample_shape, value=values[name])
        if not rv.value_given:
            missing.append(name)
        # Variables built while this density is evaluated (a rate's GP) belong to the program.
        with trace(interceptor):
            log_prob = tf.reduce_sum(rv.distribution.log_prob(rv.value))
        terms[unique_key(terms, name)] = log_prob
        constructed.add(name)
        return rv

    with trace(interceptor):
        result = model(*args, **kwargs)
    unused = sorted(set(values) - constructed)
    if unused:
        raise UnknownVariableError(
            f"make_log_joint: no random variable named {unused} in the program; it constructs "
            f"{list(terms)}."
        )
    if require_values and missing:
        raise LookupError(
            f"make_log_joint: no value for {missing}: pass each variable's value "
            f"(log_joint({missing[0]}=...)) or condition on it; a log joint at a random draw "
            "would be a different number at every call."
        )
    return terms, result


def make_log_joint(model):
    """The log joint density of a program, as a function of its variables' values.

    Args:
      model: a program: a callable constructing random variables (by name).

    Returns:
      `log_joint(*args, **values)`: calls `model(*args)` with each variable named in `values`
      set to that value and returns `sum log p(v | parents)`, a scalar. Every variable needs
      a value (from `values` or an outer `condition`): `LookupError` names those without; a
      value for a name the program lacks raises `UnknownVariableError` (a `KeyError`).

    Example (normal-normal):
      ```python
      def model():
          z = blayers.Normal(0., 1., name="z")
          return blayers.Normal(z, 0.5, name="x")
      log_joint = blayers.make_log_joint(model)
      log_joint(z=0.3, x=1.0)   # N(0.3; 0, 1) N(1.0; 0.3, 0.5), in log space
      ```
    """

    def log_joint(*args, **values):
        terms, _ = log_prob_terms(model, *args, values=values, require_values=True)
        return tf.add_n(list(terms.values())) if terms else tf.constant(0.0)

    log_joint.__name__ = f"log_joint_of_{getattr(model, '__name__', type(model).__name__)}"
    return log_joint


ELBO = collections.namedtuple("ELBO", ["elbo", "surrogate", "log_joint", "log_q"])
ELBO.__doc__ = """One Monte Carlo estimate of the ELBO.

Attributes:
  elbo: the estimate, mean over samples of `log p(x, z) - log q(z)`.
  surrogate: maximize it: equal to `elbo` in value, its gradient is the unbiased ELBO gradient
    (reparameterization, plus the score-function terms of non-reparameterized variables).
  log_joint, log_q: their means over the samples.
"""


def elbo(
    model,
    posterior,
    observed,
    model_args=(),
    posterior_args=(),
    num_samples=1,
):
    """Monte Carlo ELBO `E_q[log p(x, z) - log q(z)]` of a model and a posterior program.

    Args:
      model: the model program; `observed` fixes its observed variables.
      posterior: the posterior program; each variable it constructs stands for the model's
        variable of the same name (its value is drawn from `q` and handed to the model).
      observed: `{name: value}` of the model's observed variables.
      model_args, posterior_args: positional arguments of the two programs.
      num_samples: draws of `z ~ q`; with two or more, non-reparameterized variables get a
        leave-one-out baseline.

    Returns:
      An `ELBO`.

    Raises:
      ValueError: the posterior names an observed variable, or a variable the model lacks.
    """
    if num_samples < 1:
        raise ValueError(f"elbo: num_samples must be >= 1, got {num_samples!r}.")
    log_joints, log_qs, scores = [], [], []
    for _ in range(int(num_samples)):
        q_terms = collections.OrderedDict()
        q_score = []

        def record(f, *args, _terms=q_terms, _score=q_score, **kwargs):
            rv = traceable(f)(*args, **kwargs)
            name = kwargs.get("name") or rv.distribution.name
            if name in _terms:
                raise ValueError(
                    f"elbo: the posterior program constructs {name!r} twice; each variable "
                    "needs one name."
                )
            reparameterized = rv.distribution.reparameterization_type == tfd.FULLY_REPARAMETERIZED
            value = rv.value if reparameterized else tf.stop_gradient(rv.value)
            log_q = tf.reduce_sum(rv.distribution.log_prob(value))
            if not reparameterized:
                _score.append(log_q)
            _terms[name] = (value, log_q)
            return rv

        with trace(record):
            posterior(*posterior_args)
        clash = sorted(set(q_terms) & set(observed))
        if clash:
            raise ValueError(f"elbo: the posterior program constructs observed variables {clash}.")
        latents = {name: value for name, (value, _) in q_terms.items()}
        try:
            model_terms, _ = log_prob_terms(model, *model_args, values={**observed, **latents})
        except ValueError as error:
            raise ValueError(f"elbo: {error} (posterior: {list(q_terms)})") from error
        log_joints.append(tf.add_n(list(model_terms.values())))
        log_qs.append(tf.add_n([log_q for _, log_q in q_terms.values()]) if q_terms else 0.0)
        scores.append(tf.add_n(q_score) if q_score else None)
    log_joint = tf.stack(log_joints)
    log_q = tf.cast(tf.stack(log_qs), log_joint.dtype)
    estimates = log_joint - log_q
    surrogate = estimates
    if any(s is not None for s in scores):
        score = tf.stack([tf.cast(s, log_joint.dtype) if s is not None else 0.0 for s in scores])
        if num_samples > 1:  # leave-one-out baseline: unbiased, lower variance
            baseline = (tf.reduce_sum(estimates) - estimates) / (num_samples - 1)
        else:
            baseline = tf.zeros_like(estimates)
        signal = tf.stop_gradient(estimates - baseline) * score
        surrogate = estimates + signal - tf.stop_gradient(signal)  # value unchanged
    return ELBO(
        elbo=tf.reduce_mean(estimates),
        surrogate=tf.reduce_mean(surrogate),
        log_joint=tf.reduce_mean(log_joint),
        log_q=tf.reduce_mean(log_q),
    )


class VariationalProgram(keras.Model):
    """A model program and a posterior program, fitted by maximizing the ELBO.

    Subclasses own the layers both programs use (so their variables persist and checkpoint)
    and define:
      model_program(inputs): constructs the model's variables (observed and latent);
      posterior_program(inputs): constructs `q`'s variables, named as the model's latents;
      observed(inputs): `{name: value}` of the observed variables in a batch.

    `call(inputs)` returns `-ELBO / n` repeated `n` times, `n = len(inputs)` (the per-example
    loss the trainer averages back to `-ELBO / n`; for a point pattern, per point), its gradient
    the ELBO's; `last_elbo` holds the latest `ELBO`.

    Args:
      num_samples: draws of `z ~ q` per step.
      **kwargs: `keras.Model` arguments.
    """

    def __init__(self, num_samples=1, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(
                f"{type(self).__name__}: num_samples must be >= 1, got {num_samples!r}."
            )
        self.num_samples = num_samples
        self.last_elbo = None

    def model_program(self, inputs):
        raise NotImplementedError(f"{type(self).__name__}.model_program")  # abstract; intentional

    def posterior_program(self, inputs):
        raise NotImplementedError(
            f"{type(self).__name__}.posterior_program"
        )  # abstract; intentional

    def observed(self, inputs):
        raise NotImplementedError(f"{type(self).__name__}.observed")  # abstract; intentional

    def elbo(self, inputs, num_samples=None):
        """The `ELBO` of the programs on `inputs`."""
        return elbo(
            self.model_program,
            self.posterior_program,
            observed=self.observed(inputs),
            model_args=(inputs,),
            posterior_args=(inputs,),
            num_samples=num_samples or self.num_samples,
        )

    def non_finite_culprit(self, inputs):
        """`(variable, what)` for the first non-finite log density of one ELBO draw on
        `inputs` (posterior terms first), or None: the trainer names it when a loss is not
        finite."""
        inputs = tf.cast(inputs, self.compute_dtype)
        with tape() as recorded:
            self.posterior_program(inputs)
        latents = {}
        for name, rv in recorded.items():
            if not np.all(np.isfinite(rv.value)):
                return name, "posterior draw"
            if not np.all(np.isfinite(rv.distribution.log_prob(rv.value))):
                return name, "posterior log density"
            latents[name] = rv.value
        values = {**self.observed(inputs), **latents}
        terms, _ = log_prob_terms(self.model_program, inputs, values=values)
        for name, log_prob in terms.items():
            if not np.isfinite(log_prob):
                return name, "model log density"
        return None

    def call(self, inputs, training=False):
        del training
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype.is_floating:
            inputs = tf.cast(inputs, self.compute_dtype)
        result = self.elbo(inputs)
        self.last_elbo = result
        n = tf.shape(inputs)[0]
        return tf.fill([n], -result.surrogate / tf.cast(n, result.surrogate.dtype))


make_log_joint_fn = make_log_joint  # edward2's name
