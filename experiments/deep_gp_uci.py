"""Deep GP regression on the UCI benchmarks (paper Figure 5; Salimbeni & Deisenroth, 2017).

`experiments.uci_regression` with its deep GP methods only (depth 1 is SVGP): one trainer run
per (data set, depth, split) with `configs/deep_gp_uci.gin` (20,000 full-batch Adam steps, 100
k-means inducing points per layer), and the table of test log-likelihood and RMSE (mean +-
standard error over splits, original units) beside published numbers with their sources.

    python -m experiments.deep_gp_uci --uci_dir=../shared/data/uci --root=runs/deep_gp_uci
    python -m experiments.deep_gp_uci --uci_dir=... --datasets=yacht --depths=2 --splits=0-4 \\
        --gin_param="train.train_steps = 1500" --parallel=2

The paper's setting takes days on 2 cores for 20 splits x 3 depths x 5 sets; the documented
CPU setting is the second command (timing in the README).
"""

from absl import app, flags

from experiments import uci_regression

DEPTH_METHODS = {1: "svgp", 2: "dgp2", 3: "dgp3"}

FLAGS = flags.FLAGS


def define_flags():
    """The command line's flags (defined only when run as a script)."""
    flags.DEFINE_string("uci_dir", None, "Folder of the UCI data-set folders (20-split format).")
    flags.DEFINE_string("root", "runs/deep_gp_uci", "Folder of the runs and tables.")
    flags.DEFINE_list("datasets", uci_regression.DATASETS, "UCI data sets.")
    flags.DEFINE_list("depths", ["1", "2", "3"], "Deep GP depths (1: SVGP).")
    flags.DEFINE_string("splits", None, "Splits: k, a,b,c or a-b, e.g. 0-4 (default: all 20).")
    flags.DEFINE_multi_string("gin_param", [], "Gin bindings of every run.")
    flags.DEFINE_integer("parallel", 1, "Runs at a time.")


def run_experiment(uci_dir, root, datasets, depths, splits=None, gin_params=(), parallel=1):
    """Trains every (data set, depth, split) run (skipping finished ones) under `root/<method>`
    and writes the tables in `root`; returns the rows."""
    bad = [d for d in depths if int(d) not in DEPTH_METHODS]
    if bad:
        raise ValueError(f"--depths: {bad} unsupported (1, 2 or 3).")
    methods = [DEPTH_METHODS[int(d)] for d in depths]
    return uci_regression.run_experiment(
        uci_dir, root, methods, datasets, splits, gin_params, parallel
    )


def main(argv):
    del argv
    if not FLAGS.uci_dir:
        raise app.UsageError("--uci_dir is required (a folder in the 20-split UCI format).")
    run_experiment(
        FLAGS.uci_dir,
        FLAGS.root,
        FLAGS.datasets,
        FLAGS.depths,
        FLAGS.splits,
        FLAGS.gin_param,
        FLAGS.parallel,
    )


if __name__ == "__main__":
    define_flags()
    app.run(main)
