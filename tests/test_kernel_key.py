"""A kernel's cache address covers its helpers and the toolchain: a changed helper module is
compiled anew, never served from machine code built against the old one."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from search_spaces import get_template
from search_spaces.space import Config
from tuner.measure import kernel_key
from tuner.measure.measurer import write_source
from workloads.gemm import Gemm

ROOT = Path(__file__).resolve().parents[1]


def _intrinsic_source() -> str:
    w = Gemm.parse("16x16x16")
    t = get_template("gemm")
    cfg = {**t.default_config(w, 1), "microkernel": "intrinsic"}
    return t.codegen(w, Config(cfg))


def test_closure_follows_import_time_imports_transitively():
    src = _intrinsic_source()
    assert "from search_spaces.runtime.simd import" in src
    closure = kernel_key.project_closure(src)
    # simd itself, its package __init__ (run by the import) and what that imports at top level
    assert {"search_spaces", "search_spaces.runtime.simd", "workloads.errors"} <= set(closure)
    # imports inside function bodies are not followed (they would pull in the whole project)
    assert "tuner.dispatch" not in closure and "search_spaces.templates.gemm" not in closure
    closure2 = kernel_key.project_closure("from search_spaces.runtime.vector_ops import vdiv\n")
    assert "search_spaces.runtime.simd" in closure2            # vector_ops imports simd: transitive


def test_address_changes_with_helper_source_versions_and_template(tmp_path, monkeypatch):
    src = _intrinsic_source()
    base = write_source(src, tmp_path, "gemm/8")
    assert write_source(src, tmp_path, "gemm/8") == base               # stable
    assert write_source(src, tmp_path, "gemm/9") != base               # template version
    real = kernel_key.module_source

    def edited(name):
        found = real(name)
        if name == "search_spaces.runtime.simd" and found:
            return "edited-" + found[0], found[1]
        return found
    monkeypatch.setattr(kernel_key, "module_source", edited)
    assert write_source(src, tmp_path, "gemm/8") != base               # a helper changed
    monkeypatch.setattr(kernel_key, "module_source", real)
    monkeypatch.setattr(kernel_key, "toolchain_versions", lambda: {"numba": "0.0", "llvmlite": "0.0"})
    assert write_source(src, tmp_path, "gemm/8") != base               # numba/llvmlite upgrade


_LOAD = """
import json, numpy as np
from search_spaces import get_template
from search_spaces.space import Config
from tuner.dispatch import load_kernel
from workloads.gemm import Gemm
w = Gemm.parse("16x16x16"); t = get_template("gemm")
fn = load_kernel(w, t, Config({**t.default_config(w, 1), "microkernel": "intrinsic"}))
A = np.ones((16, 16), np.float32); C = np.empty((16, 16), np.float32); fn(A, A, C)
fn = getattr(fn, "kernel", fn)   # the compiled dispatcher behind the bound runtime arguments
import tuner.dispatch as d
files = sorted(p.name for p in (d.settings.cache_dir() / "kernels").glob("k_*.py"))
print(json.dumps({"hits": sum(fn.stats.cache_hits.values()), "ok": bool((C == 16).all()),
                  "misses": sum(fn.stats.cache_misses.values()), "files": files}))
"""


def test_editing_a_helper_in_a_copy_of_the_project_recompiles(tmp_path):
    """A real edit of search_spaces/runtime/simd.py in a copy of the project: the unchanged copy loads
    from Numba's cache, the edited one compiles anew under a new kernel file."""
    proj = tmp_path / "proj"
    for pkg in ("search_spaces", "tuner", "workloads"):
        shutil.copytree(ROOT / pkg, proj / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(proj), "TUNER_CACHE": str(tmp_path / "cache"),
           "NUMBA_NUM_THREADS": "1"}

    def load() -> dict:
        out = subprocess.run([sys.executable, "-c", _LOAD], env=env, capture_output=True,
                             text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = load()
    again = load()
    assert first["ok"] and again["ok"]
    assert again["hits"] >= 1 and again["misses"] == 0 and again["files"] == first["files"]
    simd = proj / "search_spaces" / "runtime" / "simd.py"
    simd.write_text(simd.read_text() + "\n# an edit: a helper's code changed\n")
    edited = load()
    assert edited["ok"] and edited["misses"] >= 1 and edited["hits"] == 0
    assert len(edited["files"]) == len(first["files"]) + 1
