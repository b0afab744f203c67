"""The lab: blayers' experiment framework, on top of the library (`import blayers`).

    configurables   the library's classes and functions as gin configurables (one place)
    config          gin search path, parsing with validation, operative config
    data/           data sources (bundled, TFDS, UCI, synthetic, point patterns)
    tasks/          what a prediction means: likelihood, metrics, plots
    models/         model builders (mlp, resnet, transformer, deep GP, VAE, RealNVP, RSSM, Cox)
    learners/       what a step means: supervised ELBO, variational program, Mesh TensorFlow
                    Transformer, Bayesian PlaNet (control/ and mesh/ hold their machinery)
    loop            the one schedule: steps, log / eval / checkpoint cadence, signals,
                    non-finite stop, progress
    runs/           RunDir and Checkpointer: the only code that touches a run folder
    plots, strategy, decoding
    train           the command line behind `python -m blayers.train`

Importing `blayers.lab` itself loads nothing; its modules import what they need.
"""
