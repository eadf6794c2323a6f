"""search_spaces.runtime.lazy_codegen: a callee's library is linked, not turned into machine
code; what runs, what is cached and what is inspected are the same as with Numba's eager
libraries."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from search_spaces.runtime import lazy_codegen

CHAIN = textwrap.dedent('''
    import numba
    import numpy as np
    from numba import prange

    from search_spaces.runtime import lazy_codegen

    lazy_codegen.install()

    @numba.njit(no_cpython_wrapper=True, no_cfunc_wrapper=True)
    def block(x, i):
        return x[i] * 2.0 + 1.0

    @numba.njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, parallel=True)
    def core(x, out):
        for i in prange(x.size):
            out[i] = block(x, i)

    @numba.njit(cache=True)
    def entry(x):
        out = np.empty_like(x)
        core(x, out)
        return out
''')


def _chain(tmp_path, name="lazy_chain"):
    (tmp_path / f"{name}.py").write_text(CHAIN)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_callees_are_linked_without_their_own_machine_code(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    assert lazy_codegen.install()
    m = _chain(tmp_path)
    x = np.arange(1000, dtype=np.float64)
    np.testing.assert_array_equal(m.entry(x), x * 2.0 + 1.0)
    callee = next(iter(m.block.overloads.values())).library
    entry = next(iter(m.entry.overloads.values())).library
    assert type(callee).__name__ == "LazyJITCodeLibrary"
    assert callee._deferred, "the callee's module was optimised and emitted on its own"
    assert not entry._deferred   # called from Python: its machine code exists
    # inspection completes a deferred library: optimised IR and assembly as eager ones give
    assert "ret" in m.block.inspect_asm(next(iter(m.block.overloads)))
    assert not callee._deferred


def _run(code: str, env: dict) -> str:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, check=True, timeout=300).stdout


def test_cached_entry_loads_and_runs_in_a_new_process(tmp_path):
    (tmp_path / "lazy_chain2.py").write_text(CHAIN)
    code = ("import sys; sys.path.insert(0, %r); import numpy as np, lazy_chain2 as m; "
            "x = np.arange(500.0); print(bool((m.entry(x) == x * 2 + 1).all()), "
            "len(m.entry.stats.cache_hits))" % str(tmp_path))
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    assert _run(code, env).split() == ["True", "0"]   # compiled, lazily, and cached
    assert _run(code, env).split() == ["True", "1"]   # loaded from Numba's cache


def test_the_kernel_loader_applies_the_setting(tmp_path):
    """import_kernel_module installs it, or with TUNER_LAZY_CODEGEN=0 gives Numba's own back."""
    path = tmp_path / "k_0123456789abcdef0123.py"
    path.write_text("X = 1\n")
    code = ("from search_spaces.runtime import lazy_codegen as l; l.install(); "
            "from tuner.measure.kernel_key import import_kernel_module as imp; "
            "from numba.core.codegen import JITCPUCodegen as C; "
            "imp(%r); print(l.installed(), C._library_class.__name__)" % str(path))
    assert _run(code, {"TUNER_LAZY_CODEGEN": "0"}).split() == ["False", "JITCodeLibrary"]
    assert _run(code, {"TUNER_LAZY_CODEGEN": "1"}).split() == ["True", "LazyJITCodeLibrary"]
