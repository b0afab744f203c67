"""Command-line launchers: `python -m launch.sweep` runs a grid of gin bindings locally."""
