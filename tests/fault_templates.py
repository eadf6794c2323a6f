"""Small templates for tests: a naive GEMM (fast to compile) and one that injects faults.

``FaultGemm`` has one knob, ``fault``, whose every value produces a kernel failing in one way,
so a test can tune it and see each failure classified while the run carries on.
"""
from __future__ import annotations

from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from search_spaces.template import Template

NAIVE = '''\
import numba

@numba.njit(cache=True)
def kernel(A, B, C):
    # naive triple loop, unroll={unroll}
    for i in range({M}):
        for j in range({N}):
            acc = 0.0
            for k in range({K}):
                acc += A[i, k] * B[k, j]
            C[i, j] = acc
'''

FAULTS = {
    "none": NAIVE,
    "compile": "import numba\n\n@numba.njit(cache=True)\ndef kernel(A, B, C):\n    C[0, 0] = undefined_name\n",
    "syntax": "def kernel(A, B, C)\n    pass\n",
    "raises": ("import numba\n\n@numba.njit(cache=True)\ndef kernel(A, B, C):\n"
               "    raise ValueError('kernel refuses')\n"),
    "segfault": "import ctypes\n\ndef kernel(A, B, C):\n    ctypes.string_at(0)\n",
    "hang": "import numba\n\n@numba.njit(cache=True)\ndef kernel(A, B, C):\n    i = 0\n    while C[0, 0] == C[0, 0] or i >= 0:\n        i += 1\n        C[0, 0] = 0.0\n",
    "wrong": NAIVE.replace("acc = 0.0", "acc = 1.0"),
    "unwritten": NAIVE.replace("C[i, j] = acc", "if i > 0:\n                C[i, j] = acc"),
    "invalid": NAIVE,
    # importing the module takes far longer than any build timeout used in tests
    "killed": "import os, signal\n\ndef kernel(A, B, C):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "slowbuild": "import time\ntime.sleep(600)\n\ndef kernel(A, B, C):\n    pass\n",
    # right on most buffer placements, wrong on one (A, B, C at 48, 16, 0 bytes past a line)
    "misplaced": NAIVE.replace("            C[i, j] = acc", "            C[i, j] = acc + (1.0 if (A.ctypes.data % 64, B.ctypes.data % 64, C.ctypes.data % 64) == (48, 16, 0) else 0.0)"),
}


class NaiveGemm(Template):
    name = "naive_gemm"
    version = 1
    workload_kind = "gemm"

    def space(self, workload, max_threads=1):
        return ConfigSpace([Knob("unroll", (1, 2, 4, 8), ordinal=True)])

    def default_config(self, workload, max_threads=1):
        return Config({"unroll": 1})

    def codegen(self, workload, config):
        return NAIVE.format(M=workload.M, N=workload.N, K=workload.K, unroll=config["unroll"])


class FaultGemm(Template):
    name = "fault_gemm"
    version = 1
    workload_kind = "gemm"

    def __init__(self, faults=None):
        # "slowbuild" only where a test asks for it: it costs a whole build timeout;
        # "misplaced" only there too: it passes or fails with the buffers' placement.
        self.faults = tuple(faults or [f for f in FAULTS if f not in ("slowbuild", "misplaced")])

    def space(self, workload, max_threads=1):
        return ConfigSpace(
            [Knob("fault", self.faults)],
            [Constraint("no_invalid", lambda c: "fault=invalid is rejected" if c["fault"] == "invalid" else None)],
        )

    def default_config(self, workload, max_threads=1):
        return Config({"fault": "none"})

    def codegen(self, workload, config):
        return FAULTS[config["fault"]].format(M=workload.M, N=workload.N, K=workload.K, unroll=1)


class VariantGemm(NaiveGemm):
    """The naive kernel in ``n`` textually distinct variants: a space large enough for several
    tuners to share, where every candidate is a real compile and a real run."""

    name = "variant_gemm"

    def __init__(self, n: int = 24, sleep_ms: int = 0):
        self.n, self.sleep_ms = n, sleep_ms

    def space(self, workload, max_threads=1):
        return ConfigSpace([Knob("variant", tuple(range(self.n)), ordinal=True)])

    def default_config(self, workload, max_threads=1):
        return Config({"variant": 0})

    def codegen(self, workload, config):
        src = NAIVE.format(M=workload.M, N=workload.N, K=workload.K, unroll=config["variant"])
        if self.sleep_ms:  # a slower candidate, so a test can kill a tuner mid-run
            src = "import time\n" + src.replace("def kernel(A, B, C):", "def _kernel(A, B, C):")
            src += f"\n\ndef kernel(A, B, C):\n    time.sleep({self.sleep_ms / 1000})\n    _kernel(A, B, C)\n"
        return src
