"""The runtime: a built model as a list of steps over preallocated buffers.

``Module.run(inputs)`` copies the inputs into their buffers, then calls each step's kernel
with its argument tuple — the arrays were bound at build time (group parameters, then the
output), so a run allocates nothing and does no per-element work in Python — and returns
copies of the outputs (``copy=False`` returns the internal buffers, overwritten by the next
run). ``time`` measures end-to-end latency (p50/p95), ``profile`` the time of each step, and
``overhead`` what the runtime itself costs (the same loop over no-op kernels).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from workloads.errors import UsageError


@dataclass
class Step:
    name: str                     # the fused node (its output value)
    label: str                    # e.g. "conv2d + [add -> relu]"
    kind: str                     # workload kind: conv2d, dense, injective, fixed; or "view"
    source: str                   # "tuned", "fallback", "fixed", "numpy" or "view"
    fn: Callable[..., Any] | None
    args: tuple = ()              # bound arrays: group parameters..., output
    workload: str | None = None   # workload key
    template: str | None = None
    config: dict | None = None
    note: str = ""                # why NumPy, why a fallback
    values: tuple[str, ...] = ()  # the graph values the fused group computes (its body's ops)
    out: Any = None               # the value, where args[-1] is a larger array holding it
                                  # (a padded hand-off: ``tuner.compiler.handoff``)

    @property
    def output(self) -> Any:
        """The array of the value this step computes."""
        return self.out if self.out is not None else self.args[-1]

    @property
    def placement(self) -> str:
        """Where the step writes its value when that is inside a larger array (``out``)."""
        if self.out is None:
            return ""
        held = self.args[-1]
        if held.shape[:-1] == self.out.shape[:-1]:   # the same pixels: some of the channels
            first = (self.out.ctypes.data - held.ctypes.data) // held.itemsize
            return (f"writes channels {first}..{first + self.out.shape[-1] - 1} of its "
                    f"concatenation {list(held.shape)} in place")
        return f"writes its consumer's padded image {list(held.shape)} in place"

    def __call__(self) -> None:
        self.fn(*self.args)


@dataclass
class Summary:
    name: str
    counts: dict[str, int]
    views: int
    planned_bytes: int
    naive_bytes: int
    threads: int
    opt_level: int
    build_seconds: float
    compile_seconds: float = 0.0
    array_code: int = 0   # generated kernels whose config is NumPy array code (not loops)
    handoffs: int = 0     # padded images written in place by their producers
    quant: dict | None = None      # int8 builds: coverage (``compile_model.quant_summary``)

    @property
    def kernels(self) -> int:
        return sum(self.counts.values())

    def line(self, model: str = "MODEL") -> str:
        c = self.counts
        n = self.views
        views = f" (+{n} reshape/concat group{'s' if n != 1 else ''} run in place)" if n else ""
        return (f"built {self.name}{' INT8' if self.quant else ''}: {self.kernels} kernels{views}: "
                f"{c['tuned']} tuned, {c['fallback']} fallback configs, {c['fixed']} fixed, "
                f"{c['numpy']} numpy"
                + (f" (+{self.array_code} generated as NumPy array code)" if self.array_code else "")
                + f"; {self.quant_line() + '; ' if self.quant else ''}"
                f"details: python -m tuner build {model}{' --int8' if self.quant else ''} --details")

    def quant_line(self) -> str:
        """Coverage of an int8 build (issue item 5): ops quantized vs left in FP32, the
        quantize/dequantize conversions, and quantized kernels left to NumPy."""
        q = self.quant
        fp = ", ".join(f"{op} x{n}" for op, n in q["fp32_by_op"].items())
        return (f"int8: {q['ops_quantized']} ops quantized, {q['ops_fp32']} left in FP32"
                f"{' (' + fp + ')' if fp else ''}, {q['conversions']} conversions "
                f"({q['quantize_ops']} quantize + {q['dequantize_ops']} dequantize), "
                f"{q['quantized_numpy']} of {q['quantized_kernels']} quantized kernels numpy")



@dataclass
class Timing:
    samples: list[float] = field(default_factory=list)   # seconds per run
    cpu_samples: list[float] = field(default_factory=list)   # process CPU seconds per run

    @property
    def cpu_p50(self) -> float | None:
        return float(np.percentile(self.cpu_samples, 50)) if self.cpu_samples else None

    @property
    def p50(self) -> float:
        return float(np.percentile(self.samples, 50))

    @property
    def p95(self) -> float:
        return float(np.percentile(self.samples, 95))

    def as_dict(self) -> dict:
        return {"p50_s": self.p50, "p95_s": self.p95, "n": len(self.samples),
                "min_s": float(min(self.samples))}


def time_fn(fn: Callable[[], Any], *, warmup: int = 2, repeat: int = 20,
            max_seconds: float = 20.0) -> Timing:
    """Per-call times of ``fn`` (each sample one call) after ``warmup`` calls; fewer samples
    (at least 3) when ``repeat`` calls would exceed ``max_seconds``."""
    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
        fn()
    first = (time.perf_counter() - t0) / max(1, warmup)
    n = max(3, min(repeat, int(max_seconds / max(first, 1e-9))))
    samples, cpu = [], []
    for _ in range(n):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return Timing(samples, cpu)


def time_interleaved(fns: Mapping[str, Callable[[], Any]], *, rounds: int = 2, repeat: int = 20,
                     warmup: int = 2, max_seconds: float = 20.0, settle: float = 0.0) -> dict[str, Timing]:
    """``time_fn`` of every contender in ``rounds`` alternating passes, each taking ``repeat /
    rounds`` (at least 3) samples, so a neighbour's load drifting during the run spreads over
    every contender instead of landing on one. ``settle``: seconds of sleep before each
    contender's samples, so the thread pool of the one before stops spin-waiting first (ONNX
    Runtime's 2-thread pool, still spinning after its last run, made our SqueezeNet runs
    right after it 10.2 ms instead of 6.1; 50 ms of sleep was enough, Zen 3)."""
    timing = {k: Timing() for k in fns}
    for _ in range(max(1, rounds)):
        for k, fn in fns.items():
            if settle > 0:
                time.sleep(settle)
            t = time_fn(fn, warmup=warmup, repeat=max(3, repeat // max(1, rounds)),
                        max_seconds=max_seconds)
            timing[k].samples += t.samples
            timing[k].cpu_samples += t.cpu_samples
    return timing


class Module:
    """An executable model; build it with ``tuner.build(graph)``."""

    def __init__(self, name: str, inputs: list[tuple[str, np.ndarray]], steps: list[Step],
                 outputs: list[np.ndarray], summary: Summary, threads: int) -> None:
        self.name = name
        self._inputs = inputs          # (name, preallocated buffer)
        self.steps = steps
        self._outputs = outputs
        self.summary = summary
        self.threads = threads
        self.quantized = None          # int8 builds: the tuner.quant.flow.QuantRun
        self._calls = [(s.fn, s.args) for s in steps if s.fn is not None]

    @property
    def input_names(self) -> list[str]:
        return [n for n, _ in self._inputs]

    @property
    def input_types(self) -> list[tuple[tuple[int, ...], str]]:
        return [(b.shape, b.dtype.name) for _, b in self._inputs]

    def _bind(self, inputs: Mapping[str, Any] | Sequence[Any]) -> None:
        if isinstance(inputs, Mapping):
            missing = [n for n, _ in self._inputs if n not in inputs]
            extra = sorted(set(inputs) - {n for n, _ in self._inputs})
            if missing or extra:
                raise UsageError(f"{self.name} inputs: missing {missing}, unexpected {extra}")
            values = [inputs[n] for n, _ in self._inputs]
        else:
            values = list(inputs)
            if len(values) != len(self._inputs):
                raise UsageError(f"{self.name} takes {len(self._inputs)} inputs, got {len(values)}")
        for (n, buf), v in zip(self._inputs, values):
            a = np.asarray(v)
            if a.shape != buf.shape or a.dtype != buf.dtype:
                raise UsageError(f"input {n} must be {buf.dtype.name}{list(buf.shape)}, "
                                 f"got {a.dtype.name}{list(a.shape)}")
            np.copyto(buf, a)

    def _set_threads(self) -> None:
        import numba

        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))

    def run(self, inputs: Mapping[str, Any] | Sequence[Any], *, copy: bool = True) -> list[np.ndarray]:
        """Outputs for ``inputs`` (by name or in order)."""
        self._bind(inputs)
        self._set_threads()
        for fn, args in self._calls:
            fn(*args)
        return [o.copy() for o in self._outputs] if copy else list(self._outputs)

    __call__ = run

    def run_steps(self, inputs, after: Callable[[Step], None]) -> list[np.ndarray]:
        """``run``, calling ``after(step)`` once each step has written its output (views
        included; the output is ``step.output`` for kernels). For step-by-step checks."""
        self._bind(inputs)
        self._set_threads()
        for s in self.steps:
            if s.fn is not None:
                s.fn(*s.args)
            after(s)
        return [o.copy() for o in self._outputs]

    def time(self, inputs, *, warmup: int = 2, repeat: int = 20,
             max_seconds: float = 20.0) -> Timing:
        """End-to-end latency of ``run`` (inputs bound once, outputs not copied)."""
        self._bind(inputs)
        self._set_threads()
        calls = self._calls

        def once() -> None:
            for fn, args in calls:
                fn(*args)
        return time_fn(once, warmup=warmup, repeat=repeat, max_seconds=max_seconds)

    def profile(self, inputs, *, repeat: int = 5) -> list[tuple[Step, float]]:
        """Median seconds of each step (kernels timed one by one, in order)."""
        self._bind(inputs)
        self._set_threads()
        times: dict[int, list[float]] = {}
        for _ in range(max(1, repeat)):
            for k, s in enumerate(self.steps):
                if s.fn is None:
                    continue
                t0 = time.perf_counter()
                s.fn(*s.args)
                times.setdefault(k, []).append(time.perf_counter() - t0)
        return [(self.steps[k], float(np.median(v))) for k, v in sorted(times.items())]

    def overhead(self, *, repeat: int = 200) -> float:
        """Seconds per run spent outside kernels: the same loop and argument tuples calling
        one compiled no-op instead of each kernel (Numba dispatch of the same arguments)."""
        import numba

        @numba.njit(cache=False)
        def noop(*args):  # pragma: no cover - trivial
            return 0

        calls = [(noop, args) for _, args in self._calls]
        for fn, a in calls:   # compile each argument-tuple signature first
            fn(*a)

        def once() -> None:
            for fn, a in calls:
                fn(*a)
        return time_fn(once, warmup=3, repeat=repeat, max_seconds=5.0).p50

    def details(self) -> str:
        """One line per step: source, kind, what it computes, workload/config or the reason."""
        import json

        rows = []
        for s in self.steps:
            cfg = json.dumps(s.config, sort_keys=True, separators=(",", ":")) if s.config else ""
            note = s.note.rsplit("; ", 1)[-1] if s.source == "fallback" else s.note
            what = "; ".join(x for x in (note, s.placement, cfg if s.source != "numpy" else "") if x)
            rows.append(f"  {s.source:<8} {s.kind:<9} %{s.name:<24} {s.label:<32} {what}".rstrip())
        return "\n".join(rows)
