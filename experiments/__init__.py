"""One script per paper figure or table; run them as modules from the repository root
(`python -m experiments.deep_gp_uci ...`)."""
