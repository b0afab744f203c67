"""Variational autoencoders (Kingma & Welling, 2014) built from stochastic output layers (the
paper's Figure 6): a convolutional encoder ending in `Normal(latent, prior='standard_normal')`
and a decoder ending in `Bernoulli`.

`VAE(x)` returns the decoder's random variable over the pixels given one draw `z ~ q(z|x)`;
with the latent KL in `losses` (a local loss), the trainer's objective is the negative ELBO per
example. `importance_weighted_log_likelihood(x, k)` estimates `log p(x)` (Burda et al., 2016)
and `density_metrics` reports it with the test ELBO; `reconstruct` and `sample` make the PNG
grids.
"""

import gin
import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from blayers.layers import stochastic_output as so

tfd = tfp.distributions

__all__ = ["VAE", "VQVAE", "vae", "vqvae"]


class VAE(keras.Model):
    """An encoder `x -> q(z|x)` (a `RandomVariable`) and a decoder `z -> p(x|z)`."""

    def __init__(self, encoder, decoder, latent_dim, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder, self.latent_dim = encoder, decoder, latent_dim

    def call(self, inputs, training=None):
        return self.decoder(self.encoder(inputs, training=training), training=training)

    def _log_weights(self, x, k):
        q = self.encoder(x).distribution
        z = q.sample(k)  # [k, batch, latent]
        flat = tf.reshape(z, [-1, self.latent_dim])
        decoded = self.decoder(flat).distribution
        targets = tf.reshape(
            tf.tile(tf.reshape(x, [1, tf.shape(x)[0], -1]), [k, 1, 1]), [tf.shape(flat)[0], -1]
        )
        log_px_z = tf.reshape(tf.reduce_sum(decoded.log_prob(targets), -1), [k, -1])
        prior = tfd.Normal(0.0, 1.0)
        log_pz = tf.reduce_sum(prior.log_prob(z), -1)
        log_qz = tf.reduce_sum(q.log_prob(z), -1)
        return log_px_z + log_pz - log_qz  # [k, batch]

    def importance_weighted_log_likelihood(self, x, k=100):
        """Per-example `log mean_k p(x, z_k) / q(z_k | x)`, a lower bound rising to log p(x)."""
        weights = self._log_weights(x, k)
        return tf.reduce_logsumexp(weights, 0) - tf.math.log(tf.cast(k, weights.dtype))

    def elbo(self, x, k=1):
        """Per-example ELBO estimated with `k` draws."""
        return tf.reduce_mean(self._log_weights(x, k), 0)

    def density_metrics(self, x, num_samples):
        """Test ELBO and importance-weighted log-likelihood (nats per example)."""
        k = max(int(num_samples), 1)
        batches = [x[i : i + 256] for i in range(0, len(x), 256)]
        elbo = np.concatenate([self.elbo(b, k=16).numpy() for b in batches])
        iwae = np.concatenate(
            [self.importance_weighted_log_likelihood(b, k).numpy() for b in batches]
        )
        return {
            "test_elbo": float(elbo.mean()),
            f"iwae_log_likelihood_k{k}": float(iwae.mean()),
            "test_nll": float(-iwae.mean()),
        }

    def reconstruct(self, x):
        return self(x).distribution.mean()

    def sample(self, n, seed=None):
        z = tf.random.normal([n, self.latent_dim], seed=seed)
        return self.decoder(z).distribution.mean()


@gin.configurable(module="blayers.lab.models")
def vae(input_shape, num_outputs, latent_dim=16, filters=(32, 64), hidden_units=256, name="vae"):
    """Convolutional encoder -> `Normal(latent_dim, prior='standard_normal')`; MLP decoder ->
    `Bernoulli` over the `num_outputs` pixels."""
    inputs = keras.Input(tuple(input_shape))
    h = inputs
    for f in filters:
        h = keras.layers.Conv2D(f, 3, strides=2, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    encoder = keras.Model(inputs, so.Normal(latent_dim, prior="standard_normal")(h), name="encoder")
    latent = keras.Input((latent_dim,))
    d = keras.layers.Dense(hidden_units, activation="relu")(latent)
    d = keras.layers.Dense(hidden_units, activation="relu")(d)
    decoder = keras.Model(latent, so.Bernoulli(num_outputs)(d), name="decoder")
    model = VAE(encoder, decoder, latent_dim, name=name)
    model(np.zeros((1, *input_shape), "float32"))  # build
    return model


class VQVAE(keras.Model):
    """VQ-VAE (van den Oord et al., 2017): encoder -> `VectorQuantizer` -> decoder ending in a
    stochastic output layer. Its codebook and commitment losses are local losses."""

    # No prior over codes is fitted here: `sample` decodes uniformly random codes, and the
    # sample grid says so.
    sample_label = "uniform codes"

    def __init__(self, encoder, quantizer, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.quantizer, self.decoder = encoder, quantizer, decoder

    def call(self, inputs, training=None):
        return self.decoder(
            self.quantizer(self.encoder(inputs, training=training)), training=training
        )

    def density_metrics(self, x, num_samples):
        """Reconstruction NLL and squared error, codebook perplexity, and the NLL bound with a
        uniform prior over codes (`reconstruction NLL + latents * log K`)."""
        del num_samples  # deterministic given x
        nll, error, perplexity = [], [], []
        for i in range(0, len(x), 256):
            batch = x[i : i + 256]
            out = self(batch).distribution
            flat = batch.reshape(len(batch), -1)
            nll.append(-tf.reduce_sum(out.log_prob(flat), -1).numpy())
            error.append(np.mean((out.mean().numpy() - flat) ** 2, -1))
            perplexity.append(float(self.quantizer.perplexity))
        latents = int(np.prod(self.quantizer.codes.shape[1:]))
        reconstruction = float(np.concatenate(nll).mean())
        return {
            "reconstruction_nll": reconstruction,
            "reconstruction_mse": float(np.concatenate(error).mean()),
            "codebook_perplexity": float(np.mean(perplexity)),
            "test_nll": reconstruction + latents * float(np.log(self.quantizer.num_codes)),
        }

    def reconstruct(self, x):
        return self(x).distribution.mean()

    def sample(self, n, seed=None):
        """Decodes uniformly random codes (the untrained prior of the VQ-VAE paper)."""
        shape = self.quantizer.codes.shape[1:]
        codes = tf.random.stateless_uniform(
            [n, *shape], [seed or 0, 1], 0, self.quantizer.num_codes, tf.int32
        )
        return self.decoder(tf.gather(self.quantizer.codebook, codes)).distribution.mean()


@gin.configurable(module="blayers.lab.models")
def vqvae(
    input_shape,
    num_outputs,
    num_codes=32,
    code_dim=16,
    filters=32,
    commitment_cost=0.25,
    name="vqvae",
):
    """Conv encoder (one stride-2 step) -> `VectorQuantizer(num_codes)` -> transposed-conv
    decoder -> `Bernoulli` over the `num_outputs` pixels."""
    from blayers.layers import VectorQuantizer

    inputs = keras.Input(tuple(input_shape))
    h = keras.layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(inputs)
    encoder = keras.Model(inputs, keras.layers.Conv2D(code_dim, 1)(h), name="encoder")
    codes = keras.Input(tuple(encoder.output_shape[1:]))
    d = keras.layers.Conv2DTranspose(filters, 3, strides=2, padding="same", activation="relu")(
        codes
    )
    d = keras.layers.Conv2D(input_shape[-1], 3, padding="same")(d)
    decoder = keras.Model(codes, so.Bernoulli()(keras.layers.Flatten()(d)), name="decoder")
    if int(np.prod(decoder.output_shape[1:])) != num_outputs:
        raise ValueError(
            f"vqvae decodes {decoder.output_shape[1:]} values, expected {num_outputs}."
        )
    model = VQVAE(encoder, VectorQuantizer(num_codes, commitment_cost), decoder, name=name)
    model(np.zeros((1, *input_shape), "float32"))
    return model
