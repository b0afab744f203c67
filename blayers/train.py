"""The command line, `python -m blayers.train` (or `blayers-train`): the lab's trainer CLI,
`blayers.lab.train`, started quietly (TensorFlow's start-up log off on the CPU, before it loads;
see `blayers.lab.cli_env`). Importing this module does nothing else.
"""


def run():
    """Entry point of `blayers-train` and `python -m blayers.train`."""
    from blayers.lab import cli_env

    # Before TensorFlow loads, which the trainer's `main` does once its flags are checked.
    cli_env.prepare(help_loads_tensorflow=False, load_tensorflow=False)
    from blayers.lab import train

    train.run()


if __name__ == "__main__":
    run()
