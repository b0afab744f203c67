"""Deep GP regression on the UCI benchmarks (paper Figure 5; Salimbeni & Deisenroth, 2017).

`experiments.uci_regression` with its deep GP methods only (depth 1 is SVGP): one trainer run
per (data set, depth) whose replicas are the splits (`configs/deep_gp_uci.gin`), 20,000
full-batch Adam steps, 100 k-means inducing points per layer, and the table of test
log-likelihood and RMSE (mean +- standard error over splits, original units) beside published
numbers with their sources.

    python -m blayers.experiments.deep_gp_uci --uci_dir=~/data/uci --root=runs/deep_gp_uci
    python -m blayers.experiments.deep_gp_uci --uci_dir=... --datasets=yacht --depths=2 --splits=0-4 \\
        --gin_param="train.train_steps = 1500" --parallel=2

The paper's setting takes days on 2 cores for 20 splits x 3 depths x 5 sets; the documented
CPU setting is the second command (timing in the README).
"""

from absl import flags

from blayers.experiments import uci_regression
from blayers.experiments.base import Experiment, ReportEntry

DEPTH_METHODS = {1: "svgp", 2: "dgp2", 3: "dgp3"}


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


class DeepGPUCI(Experiment):
    """`uci_regression` with its deep GP methods, chosen by depth."""

    name = "deep_gp_uci"
    report = ReportEntry(
        "fig5",
        "Figure 5: deep GP (SparseGaussianProcess layers)",
        "A code figure; published deep-GP numbers on UCI (Salimbeni & Deisenroth, 2017) are in "
        "the experiment's own table.",
        order=5,
        gin_prefixes=("deep_gp",),
        experiments=("deep_gp_uci",),
        command="python -m blayers.experiments.deep_gp_uci --uci_dir=PATH/TO/UCI --root=runs/dgp",
    )

    def define_options(self):
        flags.DEFINE_string(
            "uci_dir", None, "Folder of the UCI data-set folders (20-split format)."
        )
        flags.DEFINE_list("datasets", uci_regression.DATASETS, "UCI data sets.")
        flags.DEFINE_list("depths", ["1", "2", "3"], "Deep GP depths (1: SVGP).")
        flags.DEFINE_string("splits", None, "Splits: k, a,b,c or a-b, e.g. 0-4 (default: all 20).")

    def check(self, root, **options):
        datasets = options.get("datasets", uci_regression.DATASETS)
        uci_regression.checked_uci_dir(options.get("uci_dir"), datasets)
        uci_regression.checked_root(root)

    def run(self, root, gin_file=None, gin_params=(), parallel=1, **options):
        del gin_file
        datasets = options.get("datasets", uci_regression.DATASETS)
        return run_experiment(
            uci_regression.checked_uci_dir(options.get("uci_dir"), datasets),
            uci_regression.checked_root(root),
            datasets,
            options.get("depths", ["1", "2", "3"]),
            options.get("splits"),
            gin_params,
            parallel,
        )


EXPERIMENT = DeepGPUCI()


if __name__ == "__main__":
    EXPERIMENT.main()
