"""Recurrent sequence models: the paper's Figure 1 Bayesian RNN (Fortunato et al., 2017).

`lstm_sequence_model` embeds token ids, runs a recurrent layer over the sequence with a
(Bayesian) cell, and predicts the next token at every step: logits `[batch, time, vocab]`.
The cell's weights are drawn once per sequence; their KL joins `model.losses`.
"""

import gin
import keras

from blayers.registry import get_layer as get_layer_class

__all__ = ["lstm_sequence_model"]


@gin.configurable(module="blayers.lab.models")
def lstm_sequence_model(
    input_shape,
    num_outputs,
    vocab_size=None,
    embedding_dim=64,
    units=256,
    cell="LSTMCellReparameterization",
    embedding="Embedding",
    output_layer="Dense",
    name="bayesian_rnn",
):
    """Token ids `[batch, time]` -> next-token logits `[batch, time, num_outputs]`.

    Args:
      vocab_size: input vocabulary (default `num_outputs`, a language model).
      cell: recurrent cell class or name (`'LSTMCellReparameterization'`, `'LSTMCell'`, ...).
      embedding: `'Embedding'` or `'EmbeddingReparameterization'`.
      output_layer: per-step projection (`'Dense'`, `'DenseFlipout'`, ...).
    """
    cell_cls = get_layer_class(cell)
    inputs = keras.Input(tuple(input_shape))
    x = get_layer_class(embedding)(vocab_size or num_outputs, embedding_dim)(inputs)
    x = keras.layers.RNN(cell_cls(units), return_sequences=True)(x)
    outputs = get_layer_class(output_layer)(num_outputs)(x)
    return keras.Model(inputs, outputs, name=name)
