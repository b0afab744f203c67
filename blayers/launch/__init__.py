"""Command-line launchers: `python -m blayers.launch.sweep` runs a grid of gin bindings locally."""
