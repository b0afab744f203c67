"""One script per paper figure or table; run them as modules from the repository root
(`python -m experiments.deep_gp_uci ...`)."""

from blayers.lab import cli_env as _cli_env

_cli_env.prepare_if_cli()  # `python -m experiments.x`: before TensorFlow loads
