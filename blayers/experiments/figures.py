"""The paper's figures that one config reproduces (`python -m blayers.train`), as report entries;
the experiments with several runs carry their own (`EXPERIMENT.report`)."""

from blayers.experiments.base import ReportEntry

REPORT_ENTRIES = (
    ReportEntry(
        "fig1",
        "Figure 1: Bayesian RNN (LSTMCellReparameterization)",
        "A code figure: the paper reports no number.",
        order=1,
        gin_prefixes=("bayesian_rnn",),
        command="python -m blayers.train --gin_file=bayesian_rnn_smoke --model_dir=runs/rnn",
    ),
    ReportEntry(
        "fig4",
        "Figure 4 and appendix: Bayesian ResNet-50 (resnet.bayesian switch)",
        "A code figure: the paper reports no number.",
        order=4,
        gin_prefixes=("resnet50",),
        command="python -m blayers.train --gin_file=resnet50_smoke --model_dir=runs/resnet",
    ),
    ReportEntry(
        "fig6",
        "Figure 6: VAE and VQ-VAE (stochastic output layers)",
        "A code figure: the paper reports no number (binarized MNIST reference: about -88.7 "
        "nats for a comparable VAE).",
        order=6,
        gin_prefixes=("vae", "vqvae"),
        command="python -m blayers.train --gin_file=vae_digits_smoke --model_dir=runs/vae",
    ),
    ReportEntry(
        "fig7",
        "Figure 7: RealNVP (reversible layers)",
        "A code figure: the paper reports no number.",
        order=7,
        gin_prefixes=("realnvp",),
        command="python -m blayers.train --gin_file=realnvp_2d_smoke --model_dir=runs/realnvp",
    ),
    ReportEntry(
        "fig9",
        "Figure 9: Bayesian Transformer (WMT'14 En-Fr, Mesh TensorFlow)",
        "BLEU 43.9 for the 2.8B-parameter model on WMT'14 En-Fr (the Bayesian model matches "
        "it), trained on up to 512 TPUv2 cores. The smoke configs' BLEU is a few hundred CPU "
        "steps of a tiny model on synthetic pairs and moves a lot from run to run: the mesh "
        "smoke gave 41.0, 21.0, 21.2 and 30.1 with seeds 0-3 on one 2-core CPU (mean 28.3, "
        "standard deviation 9.5), and 35.7 with seed 0 on another machine; read it as a check "
        "that the model learns, not as a measurement.",
        order=9,
        gin_prefixes=("bayesian_transformer",),
        compare=(("bleu_beam", 43.9, "bayesian_transformer_wmt14", "BLEU"),),
        command="python -m blayers.train --gin_file=bayesian_transformer_smoke --model_dir=runs/bt",
    ),
    ReportEntry(
        "mlp",
        "The main job: Bayesian MLP on digits (README quick start)",
        "Not a paper figure.",
        order=30,
        gin_prefixes=("digits_mlp",),
        command="python -m blayers.train --gin_file=digits_mlp_smoke --model_dir=runs/digits",
    ),
)
