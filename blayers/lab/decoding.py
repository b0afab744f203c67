"""Decoding for sequence-to-sequence models: beam search (greedy is beam size 1).

`beam_search(next_log_probs, sources, ...)` works on any `next_log_probs(sources, prefixes)
-> [batch, vocab]` log-probabilities of the next token; the sequence-to-sequence task passes the
Monte Carlo predictive of a Bayesian model, `log mean_s p_s(y_t | y_<t, x)`, so decodes average
over weight samples. Hypotheses are ranked by GNMT's length-normalized score
`log p / ((5 + length) / 6)^alpha` (Wu et al., 2016).
"""

import numpy as np

__all__ = ["beam_search", "strip"]


def strip(ids, eos, pad=0):
    """The tokens before the first EOS (or PAD)."""
    out = []
    for token in ids:
        if token in (eos, pad):
            break
        out.append(int(token))
    return out


def beam_search(next_log_probs, sources, bos, eos, max_length, beam_size=4, alpha=0.6, pad=0):
    """Beam search over a batch.

    Args:
      next_log_probs: `fn(sources [n, s], prefixes [n, t]) -> [n, vocab]` log-probabilities.
      sources: `[batch, source_length]` int array.
      bos, eos, pad: the special ids.
      max_length: most tokens generated (EOS included).
      beam_size: hypotheses kept per example (1: greedy).
      alpha: length-normalization exponent (0: none).

    Returns:
      `(tokens, log_probs)`: per example the best hypothesis' tokens (without BOS and EOS) and
      its total log-probability (EOS included when generated).
    """
    sources = np.asarray(sources)
    batch, k = len(sources), int(beam_size)
    tokens = np.full((batch, k, 1), bos, np.int32)
    scores = np.full((batch, k), -np.inf)
    scores[:, 0] = 0.0
    finished = np.zeros((batch, k), bool)
    lengths = np.zeros((batch, k), np.int32)
    repeated = np.repeat(sources, k, axis=0)
    for _ in range(int(max_length)):
        log_p = np.asarray(next_log_probs(repeated, tokens.reshape(batch * k, -1)), np.float64)
        log_p = log_p.reshape(batch, k, -1)
        vocab = log_p.shape[-1]
        # A finished hypothesis continues with PAD at no cost; nothing else.
        done = np.full(vocab, -np.inf)
        done[pad] = 0.0
        log_p = np.where(finished[..., None], done, log_p)
        candidates = (scores[..., None] + log_p).reshape(batch, k * vocab)
        best = np.argsort(-candidates, axis=1, kind="stable")[:, :k]
        beam, token = best // vocab, best % vocab
        scores = np.take_along_axis(candidates, best, 1)
        previous_finished = np.take_along_axis(finished, beam, 1)
        lengths = np.take_along_axis(lengths, beam, 1) + ~previous_finished
        finished = previous_finished | (token == eos)
        tokens = np.concatenate(
            [np.take_along_axis(tokens, beam[..., None], 1), token[..., None].astype(np.int32)], -1
        )
        if finished.all():
            break
    penalty = ((5.0 + lengths) / 6.0) ** alpha
    normalized = np.where(np.isfinite(scores), scores / penalty, -np.inf)
    choice = normalized.argmax(1)
    chosen = tokens[np.arange(batch), choice, 1:]
    return [strip(row, eos, pad) for row in chosen], scores[np.arange(batch), choice]
