"""Layer classes by name, for model builders and gin-only models."""

import keras

from blayers import layers as blayers_layers

__all__ = ["get_layer_class"]


def get_layer_class(name_or_class):
    """A layer class from a class or its name (blayers.layers, then keras.layers)."""
    if isinstance(name_or_class, type):
        return name_or_class
    if callable(name_or_class) and not isinstance(name_or_class, str):
        return name_or_class
    for module in (blayers_layers, keras.layers):
        cls = getattr(module, str(name_or_class), None)
        if isinstance(cls, type) and issubclass(cls, keras.layers.Layer):
            return cls
    raise ValueError(
        f"Unknown layer {name_or_class!r}: not in blayers.layers "
        f"({', '.join(blayers_layers.__all__)}) nor keras.layers."
    )
