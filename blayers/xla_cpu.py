"""XLA's CPU vector width for blayers' fused kernels (`blayers.fused`); imports nothing heavy.

XLA's CPU backend vectorizes with 256-bit registers unless told otherwise
(`--xla_cpu_prefer_vector_width=256`), a default for CPUs that lower their clock under 512-bit
instructions. On AVX-512 CPUs without that penalty (AMD Zen 4 and 5, Intel Ice Lake and later)
512-bit vectors make the fused kernels of a Bayesian layer's step 10-25% faster: on an
AVX-512 AMD EPYC, a million Threefry words 1.00 ms instead of 1.16, Box-Muller 0.56 instead of
0.73, the softplus and its square 0.76 instead of 0.89, the KL 0.48 instead of 0.54 (its
gradients, bound by memory, no faster), and the dense estimators' training steps 0.13-0.21x
`Dense` shorter (`benchmarks/xla_vector_width.py`). Keras' `Dense` and TF's
own kernels are unaffected: this is XLA's code generation only.

XLA reads `XLA_FLAGS` once, at the first XLA compilation in a process, so `prefer_wide_vectors()`
has an effect only when called before it (at the top of a script). The library never calls it:
`import blayers` sets no environment variable. The command lines (`python -m blayers.train`,
the experiment scripts, the post-hoc CLI) and the benchmarks do, and a vector width already in
`XLA_FLAGS` wins, so `XLA_FLAGS=--xla_cpu_prefer_vector_width=256` keeps XLA's default.
"""

import os

__all__ = ["FLAG", "has_avx512", "prefer_wide_vectors"]

FLAG = "--xla_cpu_prefer_vector_width"


def has_avx512(cpuinfo="/proc/cpuinfo"):
    """Whether the CPU reports AVX-512 Foundation (`avx512f` among `/proc/cpuinfo`'s flags);
    False where that file is missing or unreadable (not Linux).

    Args:
      cpuinfo: the file to read, Linux's `/proc/cpuinfo` by default.
    """
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split(":", 1)[-1].split()
    except OSError:
        return False
    return False


def prefer_wide_vectors(environ=None, cpuinfo="/proc/cpuinfo"):
    """Appends `--xla_cpu_prefer_vector_width=512` to `XLA_FLAGS` in `environ` (default
    `os.environ`) on an AVX-512 CPU, unless `XLA_FLAGS` already names a vector width. Returns
    whether it did. Call it before anything in the process compiles with XLA.

    Args:
      environ: the environment to change, `os.environ` by default.
      cpuinfo: where the CPU's flags are read (`has_avx512`).
    """
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    if FLAG in flags or not has_avx512(cpuinfo):
        return False
    environ["XLA_FLAGS"] = f"{flags} {FLAG}=512".strip()
    return True
