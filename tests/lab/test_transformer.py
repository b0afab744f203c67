"""The Keras Bayesian Transformer: masks through the Bayesian layers, the switches,
the sequence task's maths (masked and smoothed NLL, the synthetic channel's optimum reached by
an oracle, calibration of its decodes), beam search, and a short training run."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import blayers
from blayers.lab import data as data_lib
from blayers.lab import decoding, loop, models
from blayers.lab.learners import supervised
from blayers.lab.tasks import SequenceToSequence

SMALL = {"num_layers": 1, "d_model": 16, "d_ff": 32, "num_heads": 2, "dropout": 0.0}


def _batch():
    return {
        "source": np.array([[3, 4, 5, 0], [6, 7, 0, 0]]),
        "target_in": np.array([[1, 8, 9, 10], [1, 5, 0, 0]]),
    }


def test_padding_never_reaches_real_positions():
    model = models.transformer({"source": (None,), "target_in": (None,)}, 12, **SMALL)
    x = _batch()
    padded = {k: np.pad(v, ((0, 0), (0, 3))) for k, v in x.items()}  # three more pad columns
    with blayers.posterior_mean():
        out, out_padded = model(x).numpy(), model(padded).numpy()
    np.testing.assert_allclose(out_padded[:, :4], out, rtol=1e-5, atol=1e-6)
    # Causal: a later target token does not change earlier positions.
    later = {k: v.copy() for k, v in x.items()}
    later["target_in"][0, 3] = 11
    with blayers.posterior_mean():
        changed = model(later).numpy()
    np.testing.assert_allclose(changed[0, :3], out[0, :3], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "switches, kl_terms",
    [
        ({}, 6 + 10),  # kernels: encoder 4 attention + 2 feed-forward, decoder 8 + 2
        ({"bayesian_attention": False, "bayesian_ffn": False}, 0),
        ({"bayesian_attention": False, "bayesian_ffn": False, "bayesian_embeddings": True}, 2),
    ],
)
def test_each_part_is_switchable(switches, kl_terms):
    model = models.transformer({"source": (None,), "target_in": (None,)}, 12, **SMALL, **switches)
    model(_batch())
    assert len(model.losses) == kl_terms
    names = {type(layer).__name__ for layer in model._flatten_layers()}
    assert ("MultiHeadAttentionFlipout" in names) == switches.get("bayesian_attention", True)
    assert ("DenseLocalReparameterization" in names) == switches.get("bayesian_ffn", True)


def test_sequence_nll_masks_padding_and_smooths_labels():
    logits = tf.constant(np.random.RandomState(0).randn(2, 3, 5), tf.float32)
    targets = tf.constant([[1, 2, 0], [3, 0, 0]])
    log_p = tf.nn.log_softmax(logits).numpy()
    expected = [-(log_p[0, 0, 1] + log_p[0, 1, 2]), -log_p[1, 0, 3]]
    np.testing.assert_allclose(
        SequenceToSequence().negative_log_likelihood(logits, targets).numpy(), expected, rtol=1e-6
    )
    smooth = SequenceToSequence(label_smoothing=0.1).negative_log_likelihood(logits, targets)
    uniform = -log_p.mean(-1)
    expected = [
        0.9 * expected[0] + 0.1 * (uniform[0, 0] + uniform[0, 1]),
        0.9 * expected[1] + 0.1 * uniform[1, 0],
    ]
    np.testing.assert_allclose(smooth.numpy(), expected, rtol=1e-5)


def test_channel_entropy_is_the_entropy_of_the_channel():
    probs = np.full(16, 0.1 / 16)
    probs[0] += 0.9
    assert data_lib.translation.channel_entropy(0.1, 16) == pytest.approx(
        -np.sum(probs * np.log(probs))
    )


class _Oracle(keras.Model):
    """The Bayes-optimal predictive of the synthetic channel, as logits."""

    def __init__(self, permutation, noise, vocab):
        super().__init__(name="oracle")
        self.table = tf.constant(np.asarray(permutation) + 3, tf.int32)
        self.noise, self.vocab = noise, vocab

    def call(self, inputs, training=None):
        source = tf.cast(inputs["source"], tf.int32)
        steps = tf.shape(inputs["target_in"])[1]
        lengths = tf.reduce_sum(tf.cast(source > 0, tf.int32), 1)
        t = tf.range(steps)[None]
        index = tf.clip_by_value(lengths[:, None] - 1 - t, 0, tf.shape(source)[1] - 1)
        mapped = tf.gather(self.table, tf.gather(source, index, batch_dims=1) - 3)
        content = self.vocab - 3
        right = 1.0 - self.noise + self.noise / content
        wrong = self.noise / content
        probs = tf.one_hot(mapped, self.vocab) * (right - wrong)
        probs += tf.concat([tf.zeros([3]), tf.fill([content], wrong)], 0)
        eos = tf.one_hot(tf.fill(tf.shape(mapped), 2), self.vocab)
        probs = tf.where((t < lengths[:, None])[..., None], probs, eos)
        return tf.math.log(probs + 1e-30)


def test_an_oracle_reaches_the_known_optimum_and_is_calibrated():
    data = data_lib.synthetic_translation(num_train=10, num_test=400, noise=0.2, seed=1)
    oracle = _Oracle(data.reference["permutation"], 0.2, data.num_classes)
    task = SequenceToSequence(num_decode=400, beam_size=2, decode_samples=1)
    metrics, arrays = task.evaluate(oracle, data, num_samples=1)
    # The optimum is the channel's entropy (an expectation); the realized test NLL scatters
    # around it with the per-token standard deviation of -log p over the test tokens.
    right, wrong = 1 - 0.2 + 0.2 / 16, 0.2 / 16
    per_token_sd = math.sqrt(
        right * math.log(right) ** 2
        + 15 * wrong * math.log(wrong) ** 2
        - data_lib.translation.channel_entropy(0.2, 16) ** 2
    )
    tokens = len(arrays["token_correct"])
    assert abs(metrics["token_nll"] - data.reference["token_nll_optimum"]) < 5 * per_token_sd / (
        math.sqrt(tokens)
    )
    assert metrics["token_accuracy"] == pytest.approx(
        data.reference["token_accuracy_optimum"], abs=0.02
    )
    # The decode is the noiseless mapping; its probability is the chance that the reference is
    # exactly it, so exact match is calibrated: the error is sampling noise (sd of a binned
    # mean of 400 Bernoullis, about 0.025), far below a miscalibrated model's.
    assert metrics["sequence_exact_match_calibration_error"] < 0.1
    assert metrics["sequence_exact_match"] == pytest.approx(
        np.mean([(1 - 0.2 + 0.2 / 16) ** n for n in range(3, 11)]), abs=0.1
    )


def test_beam_search_beats_greedy_on_a_garden_path():
    """First step: token 3 (p 0.6) or 4 (0.4); after 3 the next is uncertain (0.5 / 0.5), after
    4 it is certain: greedy takes 3 (total 0.3), a beam of 2 finds 4 -> 5 (0.4)."""
    table = {(): [0, 0, 0, 0.6, 0.4, 0], (3,): [0, 0, 0, 0, 0.5, 0.5], (4,): [0, 0, 0, 0, 0, 1]}

    def next_log_probs(sources, prefixes):
        out = []
        for prefix in prefixes:
            body = tuple(int(t) for t in prefix[1:])
            probs = table.get(body, [0, 0, 1.0, 0, 0, 0])  # then EOS
            out.append(np.log(np.asarray(probs) + 1e-30))
        return np.stack(out)

    sources = np.zeros((1, 1), np.int32)
    greedy, _ = decoding.beam_search(next_log_probs, sources, 1, 2, 5, beam_size=1)
    beam, log_probs = decoding.beam_search(next_log_probs, sources, 1, 2, 5, beam_size=2, alpha=0)
    assert greedy[0][:2] == [3, 4] and beam[0] == [4, 5]
    assert log_probs[0] == pytest.approx(math.log(0.4))


def test_a_short_run_learns_the_channel(tmp_path):
    import gin

    # 16 beam decodes of 2 draws score BLEU here (the configs decode 200 of 4 in their runs)
    gin.bind_parameter("SequenceToSequence.num_decode", 16)
    gin.bind_parameter("SequenceToSequence.decode_samples", 2)
    data = data_lib.synthetic_translation(num_train=1000, num_test=100, max_length=6, noise=0.0)
    metrics = loop.fit(
        str(tmp_path),
        data=data,
        model=lambda s, n: models.transformer(s, n, **dict(SMALL, d_model=32, num_heads=4)),
        optimizer=lambda: supervised.make_optimizer("adam", 3e-3),
        train_steps=150,
        batch_size=64,
        num_eval_samples=2,
        progress=False,
    )
    assert metrics["token_nll"] < 1.5  # uniform over 16 tokens: 2.8
    assert 0.0 <= metrics["bleu_beam"] <= 100.0 and "sequence_calibration_error" in metrics
    assert (tmp_path / "sequence_reliability.png").exists()


def test_transformer_schedule_warms_up_then_decays():
    schedule = models.transformer_schedule(2.0, d_model=64, warmup_steps=100)
    rates = [float(schedule(s)) for s in (0, 49, 99, 399)]
    assert rates[0] < rates[1] < rates[2] > rates[3]
    assert rates[2] == pytest.approx(2.0 * 64**-0.5 * 100**-0.5, rel=1e-6)
