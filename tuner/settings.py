"""Configuration read in one place: environment variables and default paths.

- ``TUNER_DB``: SQLAlchemy URL of the records database (default ``sqlite:///logs/tuning.db``,
  relative to the current directory; ``--db`` overrides it).
- ``TUNER_CACHE``: folder for generated kernel sources and Numba's compiled cache
  (default ``~/.cache/tuner``).
- ``TUNER_CPU``: LLVM name of the CPU to generate and compile for instead of this machine
  (``znver3``, ``haswell``, ``skylake-avx512``, ``znver4`` ...; ``search_spaces.isa.KNOWN_CPUS``).
  It becomes ``NUMBA_CPU_NAME`` (and an empty ``NUMBA_CPU_FEATURES``: that CPU's own
  features) in this process and in every worker, and the target (and its records' key) is
  that CPU's. Kernels for a CPU whose ISA this machine lacks can be shown, not run.
- ``TUNER_LAZY_CODEGEN``: ``0`` compiles generated kernels with Numba's eager code libraries
  (every Numba function's module optimised and emitted on its own) instead of
  ``search_spaces.runtime.lazy_codegen`` (each module's code optimised once, in its entry
  point); the same kernels either way, for A/B comparisons of compile time.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_DB = "sqlite:///logs/tuning.db"
# The graph pass pipeline builds, task extraction, ``tune model`` and ``verify`` run when none
# is named: 3 (NHWC, direct convolutions) for float models on every target, 2 (NCHW) for INT8
# models. Measured, ORT time / ours in one run, 1 thread: AMD Zen 5 (AVX-512, docs/bench/
# 2026-12-02c-znver5-*.json): at -O 3 every light model >= 0.90x ONNX Runtime (-O 2:
# 0.77-0.89x on five of them); AMD Zen 3 (AVX2, docs/bench/2026-12-02d-znver3-nine-models-
# o3.json): -O 3 faster than -O 2 on every model whose graph it changes, at 1 and 2 threads
# (ResNet-50 0.79 -> 0.93x ORT, Inception v1 0.99 -> 1.53x, Inception v2 0.62 -> 0.80x,
# VGG-19 0.82 -> 0.94x). (AVX2 code run on the Zen 5, TUNER_CPU=znver3, had measured -O 3 at
# 0.95-1.03x -O 2: an AVX-512 machine is no stand-in for an AVX2 one here.) The INT8 groups
# and their measurements are NCHW.
DEFAULT_OPT_LEVEL = 3
INT8_OPT_LEVEL = 2


def db_url(cli_value: str | None = None) -> str:
    return cli_value or os.environ.get("TUNER_DB") or DEFAULT_DB


def opt_level(value: int | None = None, int8: bool = False) -> int:
    """``value``, or the default pipeline level: ``DEFAULT_OPT_LEVEL`` for float models,
    ``INT8_OPT_LEVEL`` for INT8 ones."""
    if value is not None:
        return value
    return INT8_OPT_LEVEL if int8 else DEFAULT_OPT_LEVEL


def lazy_codegen() -> bool:
    return os.environ.get("TUNER_LAZY_CODEGEN", "1") != "0"


def apply_codegen() -> bool:
    """Install or remove ``lazy_codegen`` as ``TUNER_LAZY_CODEGEN`` says, before a generated
    module compiles; True when lazy libraries are in use."""
    from search_spaces.runtime import lazy_codegen as lc

    if lazy_codegen():
        return lc.install()
    lc.uninstall()
    return False


def cache_dir() -> Path:
    root = os.environ.get("TUNER_CACHE") or os.path.join(Path.home(), ".cache", "tuner")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cpu_override() -> str | None:
    """The CPU named by ``TUNER_CPU`` (None: the host), checked against the known CPUs."""
    name = os.environ.get("TUNER_CPU", "").strip()
    if not name:
        return None
    from search_spaces.isa import known_cpu_features

    known_cpu_features(name)   # an unknown name is a UsageError listing the known ones
    return name


def compile_env() -> dict[str, str]:
    """Numba's CPU settings for ``TUNER_CPU`` (empty without an override). An empty feature
    string makes LLVM use the named CPU's own features instead of the host's."""
    name = cpu_override()
    return {"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": ""} if name else {}


def apply_cpu_override() -> str | None:
    """Make this process compile for ``TUNER_CPU``: set Numba's variables and, when Numba is
    already imported, reload its configuration (it takes effect before the first compile,
    which creates the target machine; the CLI and ``host_target()`` call this first)."""
    env = compile_env()
    if any(os.environ.get(k) != v for k, v in env.items()):
        os.environ.update(env)
        if "numba" in sys.modules:
            import numba.core.config

            numba.core.config.reload_config()
    return env.get("NUMBA_CPU_NAME")
