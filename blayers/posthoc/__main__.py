"""`python -m blayers.posthoc --model_dir=RUN --method=laplace`: post-hoc uncertainty for a
finished run (the lab's `blayers.lab.posthoc_cli`, started quietly like `blayers.train`)."""

if __name__ == "__main__":
    from blayers.lab import cli_env

    cli_env.prepare(help_loads_tensorflow=False)  # before TensorFlow loads
    from blayers.lab import posthoc_cli

    posthoc_cli.run()
