"""The lab: blayers' experiment framework, on top of the library (`import blayers`).

    configurables   the library's classes and functions as gin configurables (one place)
    config          gin search path, parsing with validation, operative config
    data/           data sources (bundled, TFDS, UCI, synthetic, point patterns)
    tasks/          what a prediction means: likelihood, metrics, plots
    models/         model builders (mlp, resnet, transformer, deep GP, VAE, RealNVP, RSSM, Cox)
    trainer         the Keras training loop; control/ (Bayesian PlaNet) and mesh/ (the Mesh
                    TensorFlow Transformer) beside it
    run_files, plots, strategy, decoding
    train           the command line behind `python -m blayers.train`

Importing `blayers.lab` itself loads nothing; its modules import what they need.
"""
