#!/usr/bin/env bash
# Runs the smoke version of every experiment into RUNS (default runs/docs), then writes the
# docs' results page from those runs (docs/results/report.md, plots in report_files/) and the
# wall time of each command (docs/results/timings.md). From the repository root:
#
#   bash docs/results/reproduce.sh                 # about 12 minutes on 2 cores
#   UCI_DIR=/path/to/UCI_Datasets bash docs/results/reproduce.sh   # adds the UCI tables
#
# Each command is skipped when its runs are finished (re-running resumes), so the times are
# those of the first, complete run.
set -euo pipefail
RUNS=${1:-runs/docs}
HERE=$(dirname "$0")
TIMES="$HERE/timings.md"
mkdir -p "$RUNS"
{
  echo "| command | wall time |"
  echo "|---|---|"
} > "$TIMES.partial"

step() {
  local start=$SECONDS shown="" arg
  "$@"
  for arg in "$@"; do  # the command as typed: quotes where the shell needs them
    if [[ $arg =~ [^A-Za-z0-9_./:=,@-] ]]; then shown+=" \"$arg\""; else shown+=" $arg"; fi
  done
  printf '| `%s` | %d s |\n' "${shown# }" "$((SECONDS - start))" >> "$TIMES.partial"
}

step python -m blayers.launch.sweep --gin_file=digits_mlp \
  --sweep "mlp.dense_layer=['DenseFlipout', 'Dense']" --parallel 2 --root "$RUNS/digits"
for config in bayesian_rnn_smoke resnet50_smoke deep_gp_smoke vae_digits_smoke \
    vqvae_digits_smoke realnvp_2d_smoke realnvp_digits_smoke; do
  step python -m blayers.train --gin_file="$config" --model_dir="$RUNS/$config"
done
step python -m blayers.launch.sweep --gin_file=bayesian_transformer_smoke \
  --sweep "bayesian=[True, False]" --parallel 2 --root "$RUNS/bayesian_transformer_smoke"
step python -m blayers.train --gin_file=bayesian_transformer_mesh_smoke --num_cpu_devices=2 \
  --mesh_shape=model:2 --model_dir="$RUNS/bayesian_transformer_mesh_smoke"
step python -m blayers.experiments.cox_process --gin_file=cox_process_smoke --splits=2 \
  --root="$RUNS/cox_process_smoke" --parallel=2
step python -m blayers.experiments.bayesian_planet --gin_file=bayesian_planet_smoke --seeds=0,1 \
  --root="$RUNS/bayesian_planet_smoke" --parallel=2
step python -m blayers.experiments.uncertainty_baselines --gin_file=uncertainty_baselines_smoke \
  --root="$RUNS/uncertainty_baselines_smoke" --parallel=2
if [[ -n "${UCI_DIR:-}" ]]; then
  step python -m blayers.experiments.uci_regression --uci_dir="$UCI_DIR" --root="$RUNS/uci_yacht" \
    --methods=mc_dropout,flipout,svgp,dgp2 --datasets=yacht --splits=0-4 \
    --epochs=mc_dropout:1000 --gin_param="svgp: train.train_steps = 1500" \
    --gin_param="dgp2: train.train_steps = 1500" --parallel=2
fi
python -m blayers.experiments.report --runs "$RUNS" --out "$HERE/report" --nohtml
# The UCI folder is the user's own: the page names it UCI_DIR, not where it was.
if [[ -n "${UCI_DIR:-}" ]]; then
  sed -i "s#${UCI_DIR}#UCI_DIR#g" "$HERE/report.md" "$TIMES.partial"
fi
mv "$TIMES.partial" "$TIMES"
