"""Sequence to sequence: a Categorical over the next target token at every position, with
padding, label smoothing, teacher-forced metrics, decodes, BLEU and sequence-level
calibration."""

import os

import gin
import numpy as np
import sacrebleu
import tensorflow as tf
import tensorflow_probability as tfp

from blayers import metrics as metrics_lib
from blayers.lab import decoding, plots
from blayers.lab.tasks.base import Task, register_task
from blayers.random_variable import RandomVariable

tfd = tfp.distributions

__all__ = ["SequenceToSequence", "token_metrics", "token_statistics"]


def token_statistics(probs, targets, pad_id=0):
    """Per non-padded target token of predictive `probs [..., length, vocab]`: the target's
    probability, the confidence (max probability) and whether the argmax is the target."""
    keep = targets != pad_id
    picked = np.take_along_axis(probs, targets[..., None], -1)[..., 0]
    return picked[keep], probs.max(-1)[keep], (probs.argmax(-1) == targets)[keep]


def token_metrics(target_probs, confidences, correct):
    """Token NLL, perplexity, accuracy and ECE (15 bins) from `token_statistics`."""
    token_nll = float(-np.mean(np.log(np.asarray(target_probs, np.float64) + 1e-12)))
    return {
        "token_nll": token_nll,
        "perplexity": float(np.exp(token_nll)),
        "token_accuracy": float(np.mean(correct)),
        "token_ece": metrics_lib.calibration_error(confidences, correct),
    }


@register_task
@gin.configurable(module="blayers.lab.tasks")
class SequenceToSequence(Task):
    """Targets `[length]` of token ids (0 pads); the model maps `{'source', 'target_in'}` to
    next-token logits `[batch, length, vocab]` (or a `RandomVariable`).

    Training: the per-sequence negative log-likelihood, summed over non-padded target tokens,
    with optional label smoothing (Szegedy et al., 2016).

    Evaluation (`num_samples` weight samples; the predictive is `mean_s p_s`):

    * teacher forced, per non-padded token: NLL (`token_nll`, `perplexity`), accuracy, ECE
      (15 bins);
    * decodes of the first `num_decode` test sentences with the Monte Carlo predictive
      (`decode_samples` weight samples per step): greedy and beam search (`beam_size`,
      GNMT length normalization `alpha`), scored by sacreBLEU against the references;
    * sequence-level calibration (Kumar & Sarawagi, 2019), read here as: each beam decode's
      predicted probability `prod_t p(y_t | y_<t, x)` against its sentence BLEU / 100, binned
      like the ECE (`sequence_calibration_error`); and against exact match with the reference
      (`sequence_exact_match_calibration_error`, zero in expectation for the Bayes-optimal
      model, since `p(y | x)` is then the chance that the reference is `y`).

    Plot: `sequence_reliability.png` (token and sequence reliability diagrams).

    Args:
      label_smoothing: mass spread uniformly over the vocabulary in the training loss.
      pad_id, bos_id, eos_id: the special ids.
      num_decode: test sentences decoded (0: no decoding).
      beam_size: beam width of the beam-search decode.
      alpha: GNMT length-normalization exponent.
      decode_samples: weight samples averaged at each decoding step (at most `num_samples`).
      max_decode_length: most decoded tokens (default: the longest reference + 10).
    """

    name = "sequence_to_sequence"
    integer_targets = True

    def __init__(
        self,
        label_smoothing=0.0,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        num_decode=200,
        beam_size=4,
        alpha=0.6,
        decode_samples=4,
        max_decode_length=None,
    ):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing = float(label_smoothing)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.num_decode, self.beam_size, self.alpha = int(num_decode), int(beam_size), alpha
        self.decode_samples, self.max_decode_length = int(decode_samples), max_decode_length

    def __repr__(self):
        return f"SequenceToSequence(label_smoothing={self.label_smoothing})"

    def output_size(self, data):
        return data.num_classes

    def likelihood_from_tensor(self, outputs):
        return tfd.Categorical(logits=outputs)

    def negative_log_likelihood(self, outputs, targets):
        """Per-sequence `-sum_t log p(y_t)` over non-padded tokens (label-smoothed for logits)."""
        targets = tf.cast(targets, tf.int32)
        weights = tf.cast(tf.not_equal(targets, self.pad_id), tf.float32)
        if isinstance(outputs, RandomVariable) or not self.label_smoothing:
            token_nll = -self.likelihood(outputs).log_prob(targets)
        else:
            logits = tf.convert_to_tensor(outputs)
            vocab = tf.shape(logits)[-1]
            smooth = self.label_smoothing
            labels = tf.one_hot(targets, vocab) * (1.0 - smooth) + smooth / tf.cast(
                vocab, tf.float32
            )
            token_nll = tf.nn.softmax_cross_entropy_with_logits(
                tf.cast(labels, logits.dtype), logits
            )
        return tf.reduce_sum(tf.cast(token_nll, tf.float32) * weights, axis=-1)

    # -- evaluation ------------------------------------------------------------------------------
    def _mean_probs_fn(self, model):
        """`mean_probs(features, samples)`: the Monte Carlo predictive, traced once for every
        batch size and length (evaluation batches, and each decoding step of greedy and beam
        search), so decoding does not retrace the model at each new prefix length."""
        traced = {}

        def probs(features):
            return tf.nn.softmax(tf.convert_to_tensor(model(features, training=False)), -1)

        def mean_probs(features, samples):
            features = tf.nest.map_structure(tf.convert_to_tensor, features)
            if "fn" not in traced:
                spec = tf.nest.map_structure(
                    lambda v: tf.TensorSpec([None] * v.shape.rank, v.dtype), features
                )
                traced["fn"] = tf.function(probs, input_signature=[spec], autograph=False)
            return sum(traced["fn"](features) for _ in range(samples)).numpy() / samples

        return mean_probs

    def evaluate(self, model, data, num_samples=10, batch_size=500):
        mean_probs = self._mean_probs_fn(model)
        target_probs, confidences, correct = [], [], []
        sources, references = [], []
        for features, targets in data.test.batch(batch_size):
            p = mean_probs(features, num_samples)  # [batch, length, vocab]
            y = targets.numpy()
            picked, confidence, hit = token_statistics(p, y, self.pad_id)
            target_probs.append(picked)
            confidences.append(confidence)
            correct.append(hit)
            sources.extend(features["source"].numpy())
            references.extend(decoding.strip(row, self.eos_id, self.pad_id) for row in y)
        confidences, correct = np.concatenate(confidences), np.concatenate(correct)
        result = token_metrics(np.concatenate(target_probs), confidences, correct)
        for key in ("token_nll_optimum", "token_accuracy_optimum"):
            if key in data.reference:
                result[key] = float(data.reference[key])
        arrays = {"token_confidence": confidences, "token_correct": correct}
        if self.num_decode > 0:
            decoded = self._decode(model, data, sources, references, num_samples, mean_probs)
            result.update(decoded[0])
            arrays.update(decoded[1])
        return result, arrays

    def _decode(self, model, data, sources, references, num_samples, mean_probs=None):
        samples = max(1, min(self.decode_samples, num_samples))
        mean_probs = mean_probs or self._mean_probs_fn(model)

        def next_log_probs(src, prefix):
            p = mean_probs({"source": src, "target_in": prefix}, samples)[:, -1]
            return np.log(p + 1e-12)

        return self.decode_metrics(next_log_probs, data, sources, references)

    def decode_metrics(self, next_log_probs, data, sources, references, max_length=None):
        """Greedy and beam decodes of the first `num_decode` sources with any
        `next_log_probs(sources, prefixes) -> [n, vocab]` (a Keras model's Monte Carlo
        predictive, or a Mesh TensorFlow graph's), scored by BLEU and sequence-level
        calibration. Returns `(metrics, arrays)`."""
        count = min(self.num_decode, len(sources))
        width = max(len(s) for s in sources[:count])
        source = np.stack([np.pad(s, (0, width - len(s))) for s in sources[:count]])
        references = references[:count]
        max_length = max_length or self.max_decode_length or max(len(r) for r in references) + 10
        text = data.detokenize or (lambda ids: " ".join(str(i) for i in ids))
        refs = [text(r) for r in references]
        result, arrays = {}, {}
        for label, beam in (("greedy", 1), ("beam", self.beam_size)):
            hyps, log_probs = decoding.beam_search(
                next_log_probs, source, self.bos_id, self.eos_id, max_length, beam, self.alpha
            )
            hyp_text = [text(h) for h in hyps]
            result[f"bleu_{label}"] = float(
                sacrebleu.corpus_bleu(hyp_text, [refs], tokenize="none").score
            )
            if label == "beam":
                sentence_bleu = np.array(
                    [
                        sacrebleu.sentence_bleu(h, [r], tokenize="none").score / 100.0
                        for h, r in zip(hyp_text, refs)
                    ]
                )
                confidence = np.exp(log_probs)
                result["sequence_calibration_error"] = metrics_lib.calibration_error(
                    confidence, sentence_bleu
                )
                exact = np.array([h == r for h, r in zip(hyps, references)], np.float64)
                result["sequence_exact_match"] = float(exact.mean())
                result["sequence_exact_match_calibration_error"] = metrics_lib.calibration_error(
                    confidence, exact
                )
                arrays.update(sequence_confidence=confidence, sequence_bleu=sentence_bleu)
                arrays["examples"] = list(zip(refs[:5], hyp_text[:5]))
        return result, arrays

    def plot(self, model, data, arrays, model_dir):
        path = os.path.join(model_dir, "sequence_reliability.png")
        plots.sequence_reliability(
            arrays["token_confidence"],
            arrays["token_correct"],
            arrays.get("sequence_confidence"),
            arrays.get("sequence_bleu"),
            path,
        )
        return [path]
