"""Mesh TensorFlow (model parallelism) for the Bayesian Transformer: the compat shim that lets
Mesh TensorFlow 0.1.21's core import on TensorFlow 2.21 (`compat`)."""
