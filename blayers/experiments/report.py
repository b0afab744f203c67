"""One reproduction report: every run and experiment under `--runs`, figure by figure and table
by table of the paper, our numbers beside the paper's, with the command that produced each.

    python -m blayers.experiments.report --runs runs/ --out runs/report

writes `runs/report.html` (one offline page: plots embedded, no network) and `runs/report.md`
(plots by relative path). A run is a folder with `metrics.json` (its `command.json`, written by
`blayers.train`, names its gin files and so its figure); an experiment is a folder with
`experiment.json` (written by the experiment scripts through `blayers.launch.sweep`) and its
`results.md` table; runs inside an experiment are shown as part of it. Items with nothing under
`--runs` say so and give the command that would fill them.
"""

import base64
import html
import importlib
import os
import pkgutil
import re
import shutil

from absl import flags

from blayers.lab import cli_env
from blayers.lab.runs import RunDir

FLAGS = flags.FLAGS


def discover():
    """Every report entry, in the paper's order: each experiment module's `EXPERIMENT.report`
    and any module's `REPORT_ENTRIES` (the single-config figures of `experiments.figures`). A
    new experiment module is found here; nothing lists it."""
    from blayers import experiments

    found = []
    for module_info in pkgutil.iter_modules(experiments.__path__):
        if module_info.name in ("base", "report"):
            continue
        module = importlib.import_module(f"blayers.experiments.{module_info.name}")
        experiment = getattr(module, "EXPERIMENT", None)
        if getattr(experiment, "report", None) is not None:
            found.append(experiment.report)
        found.extend(getattr(module, "REPORT_ENTRIES", ()))
    return tuple(sorted(found, key=lambda entry: (entry.order, entry.key)))


ITEMS = discover()


def _stem(gin_file):
    return os.path.basename(str(gin_file)).removesuffix(".gin")


def collect(root):
    """`(runs, experiments)` under `root`: runs `{dir, metrics, command}`, experiments `{dir,
    record, table}`; runs inside an experiment's folder are attached to it."""
    runs, experiments = [], []
    for directory, _, files in sorted(os.walk(root)):
        inside = any(os.path.commonpath([e["dir"], directory]) == e["dir"] for e in experiments)
        run = RunDir(directory)
        if RunDir.EXPERIMENT in files and not inside:  # a part of an experiment is not another
            table = None
            if "results.md" in files:
                with open(os.path.join(directory, "results.md")) as f:
                    table = f.read()
            experiments.append(
                {
                    "dir": directory,
                    "record": run.experiment() or {},
                    "table": table,
                    "runs": [],
                }
            )
        if RunDir.METRICS in files:
            runs.append(
                {"dir": directory, "metrics": run.metrics() or {}, "command": run.command() or {}}
            )
    # A post-hoc method's output (`RUN/posthoc/<method>[-<setting>]/`) belongs to its run.
    posthoc = [r for r in runs if "base" in r["metrics"] and "method" in r["metrics"]]
    runs = [r for r in runs if r not in posthoc]
    for run in runs:
        run["posthoc"] = [
            p
            for p in posthoc
            if os.path.dirname(os.path.dirname(p["dir"])) == run["dir"]
            and os.path.basename(os.path.dirname(p["dir"])) == "posthoc"
        ]
    loose = []
    for run in runs:
        parent = next(
            (e for e in experiments if os.path.commonpath([e["dir"], run["dir"]]) == e["dir"]), None
        )
        (parent["runs"] if parent else loose).append(run)
    return loose, experiments


def _module(record):
    match = re.search(r"-m (?:blayers\.)?experiments\.(\w+)", record.get("command", ""))
    return match.group(1) if match else _stem(record.get("gin_file", ""))


def assign(runs, experiments):
    """`{item key: ([runs], [experiments])}`; unmatched ones under `'other'`."""
    out = {item.key: ([], []) for item in ITEMS}
    out["other"] = ([], [])
    for run in runs:
        stems = [_stem(g) for g in run["command"].get("gin_file", [])]
        item = next((i for i in ITEMS for s in stems if s.startswith(i.gin_prefixes)), None)
        out[item.key if item else "other"][0].append(run)
    for experiment in experiments:
        module = _module(experiment["record"])
        item = next((i for i in ITEMS if module in i.experiments), None)
        if item is None:
            stem = _stem(experiment["record"].get("gin_file", ""))
            item = next((i for i in ITEMS if stem.startswith(i.gin_prefixes)), None)
        out[item.key if item else "other"][1].append(experiment)
    return out


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if abs(value) < 1e-9:  # float round-off of an exact 0 (3.7e-18), not a measurement
        return "0"
    return f"{value:.4g}"


def run_rows(run, item):
    """`[(metric, ours, paper)]` of one run: the item's compared metrics first (with the paper's
    value where the run used the config it applies to), then the other numeric metrics."""
    final = run["metrics"].get("final", {})
    stems = [_stem(g) for g in run["command"].get("gin_file", [])]
    rows, seen = [], set()
    for key, paper, config, label in item.compare if item else ():
        if key in final:
            applies = config in stems
            note = f"{paper:g}" if applies else f"{paper:g} (for {config}, not this config)"
            rows.append((f"{label} ({key})", _number(final[key]), note))
            seen.add(key)
    for key in sorted(final):
        if key not in seen and _number(final[key]) is not None:
            rows.append((key, _number(final[key]), ""))
    for key in ("train_seconds",):
        if _number(run["metrics"].get(key)) is not None:
            rows.append((key, _number(run["metrics"][key]), ""))
    return rows


def _plots(directory, limit=4):
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".png"))[
        :limit
    ]


def experiment_plots(experiment, limit=6):
    """An experiment's figures: its own (a comparison such as PlaNet's `score.png` across
    models), then one per run (each data set's intensity of the Cox process, not only the
    first run's), training curves last."""
    own = _plots(experiment["dir"], limit)
    per_run = []
    for run in experiment["runs"]:
        pngs = _plots(run["dir"], limit=None)
        chosen = [p for p in pngs if not p.endswith("training_curves.png")] or pngs
        per_run += chosen[:1]
    return (own + per_run)[:limit]


def posthoc_rows(output):
    """`[(metric, the run's model, the method)]` of a post-hoc output on the same examples."""
    base, final = output["metrics"].get("base", {}), output["metrics"].get("final", {})
    return [
        (key, _number(base.get(key)) or "", _number(final[key]))
        for key in sorted(final)
        if _number(final[key]) is not None
    ]


def _posthoc_title(output):
    """The output's folder and its method's label: the summary's (its settings), else the
    registry's (`blayers.lab.posthoc_methods`, which the trainer and the table share)."""
    metrics = output["metrics"]
    scored = f", {metrics['checkpoint']}" if metrics.get("checkpoint") else ""
    method = metrics.get("method")
    label = metrics.get("label")
    if label is None and method:
        from blayers.lab import posthoc_methods

        known = posthoc_methods.methods().get(method)
        label = (known.label if known else None) or method
    return f"Post-hoc `{os.path.basename(output['dir'])}` ({label}{scored})"


def _command_of(run):
    return run["command"].get("command") or "(no command.json: a run made before it was recorded)"


def render_markdown(assigned, root, link=None):
    """The report as Markdown; `link(path)` is how a plot is referenced (default: its path
    relative to `root`)."""
    link = link or (lambda path: os.path.relpath(path, root))
    lines = [
        "# Reproduction report",
        "",
        f"Runs under `{root}`; `python -m blayers.experiments.report --runs {root}` rebuilds this.",
        "",
    ]
    for item in (*ITEMS, None):
        key = item.key if item else "other"
        runs, experiments = assigned[key]
        if item is None and not (runs or experiments):
            continue
        lines += [f"## {item.title if item else 'Other runs'}", ""]
        if item:
            lines += [f"Paper: {item.paper}", ""]
        if item and not (runs or experiments):
            lines += [f"Not run under `{root}`. To fill it: `{item.command}`", ""]
        for experiment in experiments:
            lines += [
                f"### Experiment `{os.path.relpath(experiment['dir'], root)}`",
                "",
                f"Command: `{experiment['record'].get('command', '?')}`",
                "",
            ]
            if experiment["table"]:
                lines += [experiment["table"].strip(), ""]
            plots = experiment_plots(experiment)
            lines += [f"![{os.path.basename(p)}]({link(p)})" for p in plots]
            lines.append("")
        for run in runs:
            lines += [
                f"### Run `{os.path.relpath(run['dir'], root)}`",
                "",
                f"Command: `{_command_of(run)}`",
                "",
                "| metric | ours | paper |",
                "|---|---|---|",
            ]
            lines += [f"| {m} | {o} | {p} |" for m, o, p in run_rows(run, item)]
            lines.append("")
            lines += [f"![{os.path.basename(p)}]({link(p)})" for p in _plots(run["dir"])]
            lines.append("")
            for output in run.get("posthoc", []):
                method = output["metrics"].get("method", "post-hoc")
                lines += [
                    f"#### {_posthoc_title(output)}",
                    "",
                    f"Command: `{_command_of(output)}`",
                    "",
                    *(f"{note}\n" for note in output["metrics"].get("notes", ())),
                    f"| metric | the run's model | {method} |",
                    "|---|---|---|",
                ]
                lines += [f"| {m} | {b} | {f} |" for m, b, f in posthoc_rows(output)]
                lines.append("")
    return "\n".join(lines) + "\n"


def _markdown_table_to_html(text):
    rows = [
        r.strip().strip("|").split("|")
        for r in text.strip().splitlines()
        if r.strip().startswith("|") and not set(r.strip()) <= set("|-: ")
    ]
    if not rows:
        return f"<pre>{html.escape(text)}</pre>"
    head = "".join(f"<th>{html.escape(c.strip())}</th>" for c in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in r) + "</tr>"
        for r in rows[1:]
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _image(path):
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f'<img alt="{html.escape(path)}" src="data:image/png;base64,{data}">'


def render_html(assigned, root):
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}"
        "code{background:#f4f4f4}img{max-width:48%;margin:2px}"
    )
    parts = [
        "<!doctype html><meta charset='utf-8'><title>blayers reproduction report</title>",
        f"<style>{style}</style>",
        f"<h1>Reproduction report</h1><p>Runs under <code>{html.escape(root)}</code>.</p>",
    ]
    for item in (*ITEMS, None):
        key = item.key if item else "other"
        runs, experiments = assigned[key]
        if item is None and not (runs or experiments):
            continue
        parts.append(f"<h2>{html.escape(item.title if item else 'Other runs')}</h2>")
        if item:
            parts.append(f"<p><b>Paper:</b> {html.escape(item.paper)}</p>")
        if item and not (runs or experiments):
            parts.append(f"<p>Not run. To fill it: <code>{html.escape(item.command)}</code></p>")
        for experiment in experiments:
            parts.append(
                f"<h3>Experiment {html.escape(os.path.relpath(experiment['dir'], root))}"
                f"</h3><p>Command: <code>"
                f"{html.escape(experiment['record'].get('command', '?'))}</code></p>"
            )
            if experiment["table"]:
                parts.append(_markdown_table_to_html(experiment["table"]))
            parts += [_image(p) for p in experiment_plots(experiment)]
        for run in runs:
            rows = "".join(
                f"<tr><td>{html.escape(m)}</td><td>{o}</td><td>{html.escape(p)}</td></tr>"
                for m, o, p in run_rows(run, item)
            )
            parts.append(
                f"<h3>Run {html.escape(os.path.relpath(run['dir'], root))}</h3>"
                f"<p>Command: <code>{html.escape(_command_of(run))}</code></p>"
                f"<table><tr><th>metric</th><th>ours</th><th>paper</th></tr>{rows}"
                "</table>"
            )
            parts += [_image(p) for p in _plots(run["dir"])]
            for output in run.get("posthoc", []):
                method = html.escape(str(output["metrics"].get("method", "post-hoc")))
                rows = "".join(
                    f"<tr><td>{html.escape(m)}</td><td>{b}</td><td>{f}</td></tr>"
                    for m, b, f in posthoc_rows(output)
                )
                parts.append(
                    f"<h4>{html.escape(_posthoc_title(output))}</h4>"
                    f"<p>Command: <code>{html.escape(_command_of(output))}</code></p>"
                    f"<table><tr><th>metric</th><th>the run's model</th><th>{method}</th></tr>"
                    f"{rows}</table>"
                )
    return "\n".join(parts) + "\n"


def _copying_link(runs_root, out):
    """A `link` for a report written outside `runs_root` (a docs page): each plot is copied to
    `<out>_files/<its path under runs_root>` and referenced there, so the page stands alone."""
    folder = out + "_files"
    shutil.rmtree(folder, ignore_errors=True)  # no plot of an earlier report lingers

    def link(path):
        relative = os.path.relpath(path, runs_root)
        target = os.path.join(folder, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
        return os.path.relpath(target, os.path.dirname(os.path.abspath(out)))

    return link


def write_report(runs_root, out, html_page=True):
    """Writes `out.md` (and `out.html` unless `html_page` is False); returns the runs and
    experiments assigned to each entry. A report outside `runs_root` gets copies of its plots
    (`out_files/`), so it can be moved (into a docs site) without the runs."""
    runs, experiments = collect(runs_root)
    assigned = assign(runs, experiments)
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    inside = os.path.commonpath([os.path.abspath(runs_root), os.path.abspath(out)])
    link = None if inside == os.path.abspath(runs_root) else _copying_link(runs_root, out)
    with open(out + ".md", "w") as f:
        f.write(render_markdown(assigned, runs_root, link))
    if html_page:
        with open(out + ".html", "w") as f:
            f.write(render_html(assigned, runs_root))
    return assigned


def define_flags():
    """The command line's flags (defined only when run as a script)."""
    flags.DEFINE_string("runs", "runs", "Folder of runs and experiments (searched recursively).")
    flags.DEFINE_string("out", None, "Output path without extension (default: RUNS/report).")
    flags.DEFINE_bool("html", True, "Also write the one-page HTML report (plots embedded).")


def main(argv):
    del argv
    cli_env.import_tensorflow_quietly()  # the runs' event files are read with it
    out = FLAGS.out or os.path.join(FLAGS.runs, "report")
    assigned = write_report(FLAGS.runs, out, html_page=FLAGS.html)
    counted = sum(len(r) + len(e) for r, e in assigned.values())
    written = f"{out}.html and {out}.md" if FLAGS.html else f"{out}.md"
    print(f"{counted} runs and experiments; wrote {written}")


if __name__ == "__main__":
    define_flags()
    cli_env.run_app(main, __doc__)
