"""One script per paper figure or table, run as modules: `python -m
blayers.experiments.deep_gp_uci ...` (in a checkout also `python -m experiments.deep_gp_uci`)."""

from blayers.lab import cli_env as _cli_env

# `python -m blayers.experiments.x`: before TensorFlow loads, which the script's `main` does
# quietly once its flags are checked (`Experiment.check`)
_cli_env.prepare_if_cli(load_tensorflow=False)
