"""`python -m blayers.posthoc --model_dir=RUN --method=laplace`: post-hoc uncertainty for a
finished run (the lab's `blayers.lab.posthoc_cli`, started quietly like `blayers.train`)."""

if __name__ == "__main__":
    # `posthoc_cli.main` prepares the process (`cli_env.prepare`) once the run folder is
    # found: a mistyped folder is said at once, before TensorFlow loads.
    from blayers.lab import posthoc_cli

    posthoc_cli.run()
