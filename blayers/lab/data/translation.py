"""Parallel corpora for sequence-to-sequence tasks (the Bayesian Transformer, paper Sec. 3.1).

Every source yields `({'source': ids, 'target_in': ids}, target_out)` with id 0 for padding,
1 for BOS and 2 for EOS: `target_in` is `BOS + target`, `target_out` is `target + EOS`
(teacher forcing), both padded to one length.

* `synthetic_translation`: a documented noisy channel whose optimum is known: the target is
  the source reversed and mapped through a fixed permutation of the vocabulary, each target
  token then replaced by a uniformly random token with probability `noise`. The Bayes-optimal
  model predicts the mapped token with probability `1 - noise + noise / V` and EOS with
  probability 1, so the optimal test NLL per target token is known exactly
  (`reference['token_nll_optimum']`, from the realized test set).
* `tfds_translation`: a TFDS translation set (WMT'14 En->Fr by default, the paper's task) with a
  joint SentencePiece vocabulary cached beside the data.
"""

import io
import math
import os

import gin
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from blayers.lab.data import tfds_source
from blayers.lab.data.base import Data
from blayers.lab.tasks import SequenceToSequence

__all__ = ["BOS", "EOS", "PAD", "channel_entropy", "parallel_data", "synthetic_translation"]

PAD, BOS, EOS = 0, 1, 2
_FIRST = 3  # the first content token


def channel_entropy(noise, vocab_size):
    """Entropy (nats) of a token through the `noise` channel over `vocab_size` tokens."""
    if noise <= 0:
        return 0.0
    right = 1.0 - noise + noise / vocab_size
    wrong = noise / vocab_size
    return -(right * math.log(right) + (vocab_size - 1) * wrong * math.log(wrong))


def _pad(sequences, length):
    out = np.zeros((len(sequences), length), np.int32)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = seq[:length]
    return out


def parallel_data(
    name, train_pairs, test_pairs, vocab_size, reference=None, detokenize=None, pad_to=None
):
    """A sequence-to-sequence `Data` from `(source ids, target ids)` pairs (no BOS/EOS, ids from
    3 on); `vocab_size` counts every id, the three special ones included. Sequences are padded
    to `pad_to` (default: each split's longest)."""

    def arrays(pairs):
        source_length = pad_to or max(len(s) for s, _ in pairs)
        target_length = pad_to or max(len(t) for _, t in pairs) + 1
        sources = _pad([s for s, _ in pairs], source_length)
        target_in = _pad([[BOS, *t] for _, t in pairs], target_length)
        target_out = _pad([[*t, EOS] for _, t in pairs], target_length)
        return sources, target_in, target_out

    train, test = arrays(train_pairs), arrays(test_pairs)

    def dataset(parts):
        sources, target_in, target_out = parts
        return tf.data.Dataset.from_tensor_slices(
            ({"source": sources, "target_in": target_in}, target_out)
        )

    return Data(
        name=name,
        task=SequenceToSequence(),
        train=dataset(train),
        test=dataset(test),
        num_train=len(train_pairs),
        num_test=len(test_pairs),
        input_shape={"source": (None,), "target_in": (None,)},
        num_classes=int(vocab_size),
        reference=dict(reference or {}),
        detokenize=detokenize,
    )


@gin.configurable(module="blayers.lab.data")
def synthetic_translation(
    num_train=4000,
    num_test=500,
    vocab_size=16,
    min_length=3,
    max_length=10,
    noise=0.1,
    seed=0,
    pad_to=None,
):
    """The noisy reversal-and-permutation channel described in the module docstring.

    Args:
      num_train, num_test: sentence pairs.
      vocab_size: content tokens V (ids 3..V+2; the model's vocabulary is V + 3).
      min_length, max_length: source lengths, uniform (targets have the same length).
      noise: probability that a target token is replaced by a uniformly random token.
      seed: seeds the corpus (the permutation, the sentences and the noise).
      pad_to: pad every sequence of both splits to this length (a graph-mode mesh run needs
        one static shape); default: each split's longest.
    """
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"synthetic_translation: noise must be in [0, 1), got {noise}.")
    if not 1 <= min_length <= max_length:
        raise ValueError(
            f"synthetic_translation: need 1 <= min_length <= max_length, got "
            f"{min_length}, {max_length}."
        )
    rng = np.random.RandomState(seed)
    permutation = rng.permutation(vocab_size)

    def pairs(count):
        out = []
        for _ in range(count):
            source = rng.randint(0, vocab_size, rng.randint(min_length, max_length + 1))
            target = permutation[source[::-1]]
            flip = rng.rand(len(target)) < noise
            target = np.where(flip, rng.randint(0, vocab_size, len(target)), target)
            out.append((list(source + _FIRST), list(target + _FIRST)))
        return out

    train, test = pairs(num_train), pairs(num_test)
    content = sum(len(t) for _, t in test)
    tokens = content + len(test)  # each target also predicts its EOS, with probability 1
    entropy = channel_entropy(noise, vocab_size)
    reference = {
        "permutation": permutation.tolist(),  # content token i (id i + 3) -> permutation[i]
        "noise": float(noise),
        "token_nll_optimum": entropy * content / tokens,
        "token_accuracy_optimum": ((1 - noise + noise / vocab_size) * content + len(test)) / tokens,
    }
    return parallel_data(
        "synthetic_translation",
        train,
        test,
        vocab_size + _FIRST,
        reference=reference,
        pad_to=pad_to,
    )


def sentencepiece_vocabulary(texts, path, vocab_size):
    """A SentencePiece model (unigram) trained on `texts`, cached at `path` (`.model`): built
    once, then read back. Ids: 0 pad, 1 BOS, 2 EOS, 3 unknown, subwords from 4."""
    import sentencepiece as spm

    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=int(vocab_size),
            pad_id=PAD,
            bos_id=BOS,
            eos_id=EOS,
            unk_id=3,
            character_coverage=1.0,
            hard_vocab_limit=False,
            minloglevel=2,
        )
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(model.getvalue())
        os.replace(tmp, path)  # atomic: a killed build leaves no half-written vocabulary
    return spm.SentencePieceProcessor(model_file=path)


@gin.configurable(module="blayers.lab.data")
def tfds_translation(
    name="wmt14_translate/fr-en",
    source_language="en",
    target_language="fr",
    data_dir=None,
    vocab_size=32000,
    vocab_sentences=200_000,
    max_length=64,
    max_train=1_000_000,
    max_test=3000,
    train_split="train",
    test_split="test",
    download=False,
    vocab_dir=None,
):
    """A TFDS translation set (default WMT'14 English -> French, the paper's task) with a joint
    SentencePiece subword vocabulary.

    The vocabulary is trained on the first `vocab_sentences` training pairs (both languages)
    and cached as `<vocab_dir or data_dir or ~/.cache/blayers>/sentencepiece/
    <name>_<vocab_size>_<vocab_sentences>.model`.
    Pairs whose source or target exceeds `max_length - 1` subwords are skipped; at most
    `max_train` and `max_test` pairs are kept (in the splits' order), padded to `max_length`.
    BLEU is computed on detokenized text.

    Args:
      name, source_language, target_language: the TFDS builder and its two text features.
      data_dir, download: as `tfds.load`.
      vocab_size: SentencePiece vocabulary size (ids 0-3 are pad, BOS, EOS, unknown).
      vocab_sentences: training pairs the vocabulary is learned from.
      max_length: subwords per padded sequence.
      max_train, max_test: pairs kept per split.
      train_split, test_split: TFDS split names.
      vocab_dir: where the vocabulary is cached (default under `data_dir`).
    """
    splits = tfds_source.load(
        "tfds_translation", name, data_dir, download, split=[train_split, test_split]
    )

    def texts(split, limit):
        for example in tfds.as_numpy(split.take(limit)):
            yield (
                example[source_language].decode("utf-8"),
                example[target_language].decode("utf-8"),
            )

    cache = vocab_dir or os.path.join(
        data_dir or os.path.join(os.path.expanduser("~"), ".cache", "blayers"), "sentencepiece"
    )
    path = os.path.join(cache, f"{name.replace('/', '_')}_{vocab_size}_{vocab_sentences}.model")
    sp = sentencepiece_vocabulary(
        (t for pair in texts(splits[0], vocab_sentences) for t in pair), path, vocab_size
    )

    def pairs(split, limit):
        out = []
        for source, target in texts(split, -1):
            s, t = sp.encode(source), sp.encode(target)
            if 0 < len(s) < max_length and 0 < len(t) < max_length:
                out.append((s, t))
                if len(out) >= limit:
                    break
        if not out:
            raise ValueError(f"tfds_translation: no {name} pair of at most {max_length} subwords.")
        return out

    train, test = pairs(splits[0], max_train), pairs(splits[1], max_test)
    return parallel_data(
        name,
        train,
        test,
        sp.get_piece_size(),
        reference={"vocabulary": path},
        detokenize=lambda ids: sp.decode([int(i) for i in ids]),
        pad_to=max_length,
    )
