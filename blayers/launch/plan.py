"""Planning a sweep: the runs of a grid (the product of `--sweep NAME=[...]` lists) or of a
random search (`--num_samples` draws of `NAME=loguniform(a, b)`, ...), each a run name and its
bindings. Pure functions of the command line's text; nothing runs here.
"""

import ast
import itertools
import re

import numpy as np

__all__ = [
    "DISTRIBUTIONS",
    "parse_distribution",
    "parse_sweep",
    "plan_random",
    "plan_runs",
    "plan_sweep",
]


def _split_top_level(text):
    """Splits `a, [b, c], 'd,e'` at top-level commas."""
    parts, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_sweep(spec):
    """`'name=[v1, v2]'` -> `(name, ['v1', 'v2'])` with each value as gin text."""
    if "=" not in spec:
        raise ValueError(f"--sweep {spec!r}: expected NAME=[VALUE, ...].")
    name, values = (s.strip() for s in spec.split("=", 1))
    if not (values.startswith("[") and values.endswith("]")):
        raise ValueError(f"--sweep {spec!r}: the values must be a [list].")
    try:
        texts = [repr(v) for v in ast.literal_eval(values)]
    except (ValueError, SyntaxError):  # gin references such as @DenseFlipout
        texts = _split_top_level(values[1:-1])
    if not texts:
        raise ValueError(f"--sweep {spec!r}: no values.")
    return name, texts


# Random search: `NAME=dist(args)`, sampled with numpy from `--seed` (so a re-run draws the
# same runs and resumes them). A plain list is `choice`.
DISTRIBUTIONS = {
    "uniform": lambda rng, low, high: rng.uniform(low, high),
    "loguniform": lambda rng, low, high: float(np.exp(rng.uniform(np.log(low), np.log(high)))),
    "randint": lambda rng, low, high: int(rng.integers(low, high)),  # high excluded
    "normal": lambda rng, mean, stddev: rng.normal(mean, stddev),
    "choice": lambda rng, values: values[int(rng.integers(len(values)))],
}


def parse_distribution(spec):
    """`'name=loguniform(1e-4, 1e-2)'` -> `(name, 'loguniform', (1e-4, 1e-2))`; a list
    `'name=[a, b]'` -> `(name, 'choice', ([a, b],))` (values as Python literals)."""
    if "=" not in spec:
        raise ValueError(f"--sweep {spec!r}: expected NAME=dist(args) or NAME=[VALUE, ...].")
    name, text = (s.strip() for s in spec.split("=", 1))
    match = re.fullmatch(r"(\w+)\((.*)\)", text, re.DOTALL)
    if match is None:
        if text.startswith("["):
            return name, "choice", (ast.literal_eval(text),)
        raise ValueError(f"--sweep {spec!r}: expected dist(args) or a [list].")
    kind, arg_text = match.groups()
    if kind not in DISTRIBUTIONS:
        raise ValueError(
            f"--sweep {spec!r}: unknown distribution {kind!r} ({sorted(DISTRIBUTIONS)})."
        )
    try:
        args = ast.literal_eval(f"({arg_text},)")
    except (ValueError, SyntaxError):
        raise ValueError(f"--sweep {spec!r}: the arguments must be Python literals.") from None
    if kind == "loguniform" and not 0 < args[0] < args[1]:
        raise ValueError(f"--sweep {spec!r}: loguniform needs 0 < low < high.")
    return name, kind, args


def _short(value):
    """A sampled float rounded to 6 significant digits (its binding and its run name agree)."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def plan_random(specs, num_samples, seed=0):
    """`[(run_name, {name: value_text})]`: `num_samples` draws of the distributions `specs`
    (`parse_distribution` strings) from a numpy generator seeded with `seed`."""
    parsed = [parse_distribution(s) for s in specs]
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(num_samples):
        values = {name: _short(DISTRIBUTIONS[kind](rng, *args)) for name, kind, args in parsed}
        label = "_".join(f"{_slug(n.split('.')[-1])}-{_slug(repr(v))}" for n, v in values.items())
        runs.append((f"trial{i:03d}_{label}"[:120], {n: repr(v) for n, v in values.items()}))
    return runs


def _slug(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "", text.replace(" ", ""))[:40] or "v"


def plan_runs(sweeps):
    """`[(run_name, {name: value_text})]` for the Cartesian product of the sweeps."""
    names = [name for name, _ in sweeps]
    runs, seen = [], set()
    for values in itertools.product(*[texts for _, texts in sweeps]):
        bindings = dict(zip(names, values))
        run_name = "_".join(f"{_slug(n.split('.')[-1])}-{_slug(v)}" for n, v in bindings.items())
        run_name = run_name or "run"
        base, i = run_name, 1
        while run_name in seen:
            run_name, i = f"{base}-{i}", i + 1
        seen.add(run_name)
        runs.append((run_name, bindings))
    return runs


def plan_sweep(args):
    """`(planned runs, binding names)` of the `--sweep` grid (their product) or, with
    `--search=random`, of `--num_samples` draws of their distributions."""
    search = getattr(args, "search", "grid")
    if search == "random":
        planned = plan_random(args.sweep, args.num_samples, args.seed)
        return planned, [parse_distribution(s)[0] for s in args.sweep]
    if search != "grid":
        raise ValueError(f"--search={search!r}: use 'grid' or 'random'.")
    for spec in args.sweep:
        if re.fullmatch(r"[^=]+=\s*\w+\(.*\)\s*", spec, re.DOTALL):
            raise ValueError(f"--sweep {spec!r}: a distribution needs --search=random.")
    sweeps = [parse_sweep(s) for s in args.sweep]
    return plan_runs(sweeps), [n for n, _ in sweeps]
