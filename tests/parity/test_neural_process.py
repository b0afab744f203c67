"""edward2's `edward2/tensorflow/layers/neural_process_test.py`, translated. blayers'
`NeuralProcess` returns a random variable (its `.distribution` is edward2's returned
distribution) and adds the KL to `losses` as the batch's mean (a loss Keras sums, at the
per-example scale of the likelihood), where edward2 adds one KL per task, `[B, 1]`: the
training loop uses the scalar as it stands (README)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from blayers import layers as ed_layers


def train_neural_process(model, train_data, valid_data, num_epochs, batch_size, learning_rate=1e-4):
    """Trains the NeuralProcess model. Validation data is used for early stopping."""
    optimizer = keras.optimizers.Adam(learning_rate)
    context_x, context_y, target_x, target_y = train_data
    valid_context_x, valid_context_y, valid_target_x, valid_target_y = valid_data
    train_data_size = target_x.shape[0]
    num_updates_per_epoch = train_data_size // batch_size
    best_loss = np.inf
    valid_query = (valid_context_x, valid_context_y), valid_target_x

    for _ in range(num_epochs):
        for i in range(num_updates_per_epoch):
            start_idx, end_idx = batch_size * i, batch_size * (i + 1)
            batch_query = (
                (context_x[start_idx:end_idx], context_y[start_idx:end_idx]),
                target_x[start_idx:end_idx],
            )
            batch_target_y = target_y[start_idx:end_idx]
            num_targets = tf.shape(batch_target_y)[1]
            with tf.GradientTape() as tape:
                predictive_dist = model(batch_query, batch_target_y).distribution
                log_p = predictive_dist.log_prob(batch_target_y)
                kl = model.losses[-1]
                loss = -tf.reduce_mean(log_p - kl / tf.cast(num_targets, tf.float32))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        predictive_dist = model(valid_query, valid_target_y).distribution
        log_p = predictive_dist.log_prob(valid_target_y)
        kl = model.losses[-1]
        valid_loss = -tf.reduce_mean(log_p - kl / tf.cast(num_targets, tf.float32))
        best_loss = min(best_loss, valid_loss)

    return best_loss


class Setup:
    def __init__(self):
        num_train_problems = num_valid_problems = 32
        num_targets, num_contexts, input_dim = 50, 10, 5

        def _create_fake_dataset(num_problems):
            target_x = np.random.rand(num_problems, num_targets, input_dim).astype(np.float32)
            target_y = np.random.rand(num_problems, num_targets, 1).astype(np.float32)
            context_x, context_y = (target_x[:, :num_contexts, :], target_y[:, :num_contexts, :])
            return (context_x, context_y, target_x, target_y)

        self.train_data = _create_fake_dataset(num_train_problems)
        self.valid_data = _create_fake_dataset(num_valid_problems)
        hidden_size, num_latents = 128, 16
        np_attention_wrapper = ed_layers.Attention(
            rep="identity", output_sizes=None, att_type="uniform"
        )
        self.np_model = ed_layers.NeuralProcess(
            latent_encoder_sizes=[hidden_size] * 4,
            num_latents=num_latents,
            decoder_sizes=[hidden_size] * 2 + [2],
            use_deterministic_path=True,
            deterministic_encoder_sizes=[hidden_size] * 4,
            attention_wrapper=np_attention_wrapper,
        )
        anp_attention_wrapper = ed_layers.Attention(
            rep="mlp", output_sizes=[hidden_size] * 2, att_type="multihead"
        )
        self.anp_model = ed_layers.NeuralProcess(
            latent_encoder_sizes=[hidden_size] * 4,
            num_latents=num_latents,
            decoder_sizes=[hidden_size] * 2 + [2],
            use_deterministic_path=True,
            deterministic_encoder_sizes=[hidden_size] * 4,
            attention_wrapper=anp_attention_wrapper,
        )
        self.models = [self.np_model, self.anp_model]
        self.num_latents, self.hidden_size, self.num_targets = (
            num_latents,
            hidden_size,
            num_targets,
        )


@pytest.fixture
def setup():
    return Setup()


def test_termination(setup):
    for model in setup.models:
        validation_loss = train_neural_process(
            model,
            setup.train_data,
            setup.valid_data,
            num_epochs=2,
            batch_size=16,
            learning_rate=1e-4,
        )
        assert validation_loss >= 0.0


def test_latent_encoder(setup):
    valid_context_x, valid_context_y, _, _ = setup.valid_data
    batch_size = valid_context_x.shape[0]
    for model in setup.models:
        dist = model.latent_encoder(valid_context_x, valid_context_y).distribution
        assert dist.loc.shape == (batch_size, setup.num_latents)
        assert dist.scale.shape == (batch_size, setup.num_latents, setup.num_latents)


def test_deterministic_encoder(setup):
    valid_context_x, valid_context_y, valid_target_x, _ = setup.valid_data
    batch_size = valid_context_x.shape[0]
    for model in setup.models:
        embedding = model.deterministic_encoder(valid_context_x, valid_context_y, valid_target_x)
        assert embedding.shape == (batch_size, setup.num_targets, setup.hidden_size)


def test_call(setup):
    valid_context_x, valid_context_y, valid_target_x, valid_target_y = setup.valid_data
    batch_size = valid_context_x.shape[0]
    for model in setup.models:
        query = (valid_context_x, valid_context_y), valid_target_x
        # test 'training' when target_y is available
        predictive_dist = model(query, valid_target_y).distribution
        assert predictive_dist.loc.shape == (batch_size, setup.num_targets, 1)
        assert predictive_dist.scale.shape == (batch_size, setup.num_targets, 1, 1)
        assert all(float(loss) >= 0.0 for loss in model.losses)
        # test 'testing' when target_y is unavailable
        predictive_dist = model(query).distribution
        assert predictive_dist.loc.shape == (batch_size, setup.num_targets, 1)
        assert predictive_dist.scale.shape == (batch_size, setup.num_targets, 1, 1)
