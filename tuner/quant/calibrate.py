"""Calibration: run the FP32 graph on sample inputs and choose each tensor's range.

Samples are either ``N`` seeded random inputs (``random_inputs(graph, seed=i)``, what
``verify`` feeds) or a ``.npy``/``.npz`` file of real inputs. Every float tensor the graph
computes is recorded with the NumPy executor. Methods:

- ``minmax``: the smallest and largest value seen;
- ``percentile``: the ``(100 - p)``-th and ``p``-th percentiles (default p = 99.99) of all
  values seen, from a 2048-bin histogram over [min, max] (two-sided, so an asymmetric
  uint8 range keeps its asymmetry; ONNX Runtime's is symmetric in |x|);
- ``entropy``: the threshold whose quantized distribution is closest to the observed one in
  KL divergence (TensorRT's method, as ONNX Runtime's entropy calibrator). Tensors that are
  never negative (post-relu) are searched one-sided over [0, max] with 255 levels; others
  symmetric in |x| with 128 levels per side, then the range is [-t, t].

Percentile and entropy need a second pass over the samples (histograms over the first
pass's [min, max]), so their results do not depend on the order of the samples.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from workloads.errors import UsageError
from workloads.graph.executor import execute, random_inputs
from workloads.graph.ir import Graph

NUM_BINS = 2048
DEFAULT_PERCENTILE = 99.99


# ---- sample inputs --------------------------------------------------------------------

@dataclass
class Samples:
    """Input sets for a graph (each a list of arrays in graph-input order), and labels."""

    source: str
    inputs: list[list[np.ndarray]]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.inputs)


def random_samples(graph: Graph, n: int, first_seed: int = 0) -> Samples:
    if n < 1:
        raise UsageError(f"need at least one calibration input, got {n} (an empty set)")
    return Samples(f"random:{n}:seed{first_seed}",
                   [random_inputs(graph, seed=first_seed + i) for i in range(n)])


def _split(name: str, arr: np.ndarray, shape: tuple[int, ...], dtype: str, path: str) -> list[np.ndarray]:
    """Rows of ``arr`` as inputs of ``shape``: arr is [S, *shape] or [S * batch, *shape[1:]]."""
    if arr.dtype.kind not in "f":
        raise UsageError(f"{path}: input {name!r} has dtype {arr.dtype.name}; "
                         f"calibration data must be floating point (the input is {dtype})")
    if arr.ndim == len(shape) + 1 and tuple(arr.shape[1:]) == shape:
        rows = [arr[i] for i in range(arr.shape[0])]
    elif arr.ndim == len(shape) and shape and tuple(arr.shape[1:]) == shape[1:] \
            and shape[0] > 0 and arr.shape[0] % shape[0] == 0:
        rows = [arr[i:i + shape[0]] for i in range(0, arr.shape[0], shape[0])]
    else:
        raise UsageError(f"{path}: input {name!r} has shape {list(arr.shape)}; expected "
                         f"[samples, {', '.join(map(str, shape))}] or "
                         f"[samples * {shape[0] if shape else 1}, {', '.join(map(str, shape[1:]))}]")
    if not rows:
        raise UsageError(f"{path}: input {name!r} holds no samples (an empty set)")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise UsageError(f"{path}: input {name!r} holds {bad} NaN/inf value(s); "
                         "calibration data must be finite")
    return [np.ascontiguousarray(r, dtype=dtype) for r in rows]


LABEL_KEYS = ("y", "labels")


def file_samples(graph: Graph, path: str) -> Samples:
    """Samples from ``.npy`` (one-input graphs) or ``.npz`` (arrays named after the inputs,
    or one array for a one-input graph; an optional ``y``/``labels`` array holds labels)."""
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    params = graph.inputs
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:  # ValueError, OSError, zipfile errors: all mean "not NumPy data"
        raise UsageError(f"{path}: not a readable .npy/.npz file ({exc})") from None
    labels = None
    if isinstance(loaded, np.ndarray):
        arrays = {params[0].name: loaded} if len(params) == 1 else {}
        if len(params) != 1:
            raise UsageError(f"{path}: the graph has {len(params)} inputs; give a .npz with "
                             f"arrays named {', '.join(p.name for p in params)}")
    else:
        with loaded:
            data = {k: loaded[k] for k in loaded.files}
        for k in LABEL_KEYS:
            if k in data:
                labels = data.pop(k)
        if len(params) == 1 and len(data) == 1:
            arrays = {params[0].name: next(iter(data.values()))}
        else:
            missing = [p.name for p in params if p.name not in data]
            if missing:
                raise UsageError(f"{path}: no array for input(s) {', '.join(missing)} "
                                 f"(arrays: {', '.join(sorted(data)) or 'none'})")
            arrays = {p.name: data[p.name] for p in params}
    columns = [_split(p.name, arrays[p.name], p.type.shape, p.type.dtype, path) for p in params]
    counts = {len(c) for c in columns}
    if len(counts) != 1:
        raise UsageError(f"{path}: inputs hold different numbers of samples ({sorted(counts)})")
    inputs = [list(row) for row in zip(*columns)]
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if labels.shape[0] != len(inputs) or labels.dtype.kind not in "iu":
            raise UsageError(f"{path}: labels must be {len(inputs)} integers, got "
                             f"{labels.dtype.name}{list(labels.shape)}")
    return Samples(f"file:{os.path.basename(path)}:{len(inputs)}", inputs, labels)


def samples_from_arg(graph: Graph, arg: str, first_seed: int = 0) -> Samples:
    """``N`` (seeded random inputs) or a path to a .npy/.npz file."""
    text = str(arg).strip()
    if text.lstrip("-").isdigit():
        return random_samples(graph, int(text), first_seed)
    if not text.endswith((".npy", ".npz")):
        raise UsageError(f"calibration must be a number of random inputs or a .npy/.npz file, got {arg!r}")
    return file_samples(graph, text)


# ---- statistics -----------------------------------------------------------------------

def calibrated_names(graph: Graph) -> list[str]:
    """The float tensors to calibrate: graph inputs and every float value an op computes."""
    return [n.name for n in graph.nodes
            if (n.is_input or n.is_compute) and n.type is not None and n.type.is_float]


def _run_all(graph: Graph, names: Sequence[str], samples: Samples) -> Iterator[dict[str, np.ndarray]]:
    g = graph.replace(outputs=tuple(names))
    for inputs in samples.inputs:
        yield dict(zip(names, execute(g, inputs)))


@dataclass
class TensorStats:
    lo: float = np.inf
    hi: float = -np.inf
    hist: np.ndarray | None = field(default=None, repr=False)

    def add_minmax(self, a: np.ndarray) -> None:
        if a.size:
            self.lo = min(self.lo, float(a.min()))
            self.hi = max(self.hi, float(a.max()))

    def edges(self) -> tuple[float, float]:
        """Histogram range: [min, max], or [0, max|x|] of |x| when values are negative."""
        if self.lo >= 0:
            return 0.0, max(self.hi, 1e-12)
        return 0.0, max(abs(self.lo), abs(self.hi), 1e-12)

    def add_hist(self, a: np.ndarray) -> None:
        lo, hi = self.edges()
        v = a.reshape(-1).astype(np.float64)
        if self.lo < 0:
            v = np.abs(v)
        h, _ = np.histogram(v, bins=NUM_BINS, range=(lo, hi))
        self.hist = h if self.hist is None else self.hist + h


def _percentile_range(p: float, values_hist: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    cdf = np.cumsum(values_hist) / max(1, values_hist.sum())
    width = (hi - lo) / NUM_BINS
    i_hi = int(np.searchsorted(cdf, p / 100.0))
    i_lo = int(np.searchsorted(cdf, 1.0 - p / 100.0))
    return lo + i_lo * width, lo + min(NUM_BINS, i_hi + 1) * width


def kl_threshold(hist: np.ndarray, levels: int, stride: int = 4) -> int:
    """Number of leading bins whose ``levels``-level quantization loses least (min KL)."""
    hist = hist.astype(np.float64)
    nbins = hist.size
    best_i, best_kl = nbins, np.inf
    for i in range(levels, nbins + 1, stride):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()        # outliers clamp into the last bin
        nz = p > 0
        if not nz.any():
            continue
        # Q: merge the i bins into `levels` groups, spread each group's mass over its nonzero bins.
        groups = np.minimum((np.arange(i) * levels) // i, levels - 1)
        mass = np.bincount(groups, weights=hist[:i], minlength=levels)
        count = np.bincount(groups, weights=(hist[:i] > 0).astype(np.float64), minlength=levels)
        q = np.where(hist[:i] > 0, mass[groups] / np.maximum(count[groups], 1), 0.0)
        ps, qs = p / p.sum(), q / max(q.sum(), 1e-300)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(nz, ps * np.log(ps / np.where(qs > 0, qs, 1e-12)), 0.0)
        kl = float(terms.sum())
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i


def _range_of(st: TensorStats, method: str, percentile: float) -> tuple[float, float]:
    if method == "minmax" or st.hist is None or not st.hist.any():
        return st.lo, st.hi
    lo_e, hi_e = st.edges()
    width = (hi_e - lo_e) / NUM_BINS
    if method == "percentile":
        if st.lo >= 0:
            return _percentile_range(percentile, st.hist, lo_e, hi_e)
        # |x| histogram: the p-th percentile of |x| bounds both sides (clipped to what was seen)
        _, t = _percentile_range(percentile, st.hist, lo_e, hi_e)
        return max(st.lo, -t), min(st.hi, t)
    if method == "entropy":
        one_sided = st.lo >= 0
        i = kl_threshold(st.hist, 255 if one_sided else 128)
        t = lo_e + i * width
        return (0.0, t) if one_sided else (max(st.lo, -t), min(st.hi, t))
    raise AssertionError(method)


METHODS = ("minmax", "percentile", "entropy")
# Bumped when the same statistics give other ranges (stored calibrations are keyed by it):
# 2 = the output head keeps its observed range under every method (2026-12-07).
ALGORITHM_VERSION = 2
# Ops whose every output value mixes many input values: past one, a tensor's extremes are
# no longer the model's answer.
MIXING_OPS = frozenset({"conv2d", "dense", "matmul"})


def output_head(graph: Graph) -> set[str]:
    """The tensors that reach a graph output through no conv2d/dense/matmul: the logits and
    what pooling, softmax and reshapes make of them. Their largest values are the answer
    (argmax, top-k), so a clipping method (``percentile``, ``entropy``) leaves them their
    observed range: clipped, the top classes saturate to one value and the ranking is lost
    (SqueezeNet's classifier conv clipped from 17.1 to 8.5 by the KL threshold agreed with
    FP32 on 0 of 20 inputs; docs/quantization.md, "Clipping methods and the model's answer")."""
    users = graph.users
    head: set[str] = set()
    for n in reversed(graph.nodes):   # users before producers
        if not n.is_compute:
            continue
        if n.name in graph.output_set:
            head.add(n.name)
            continue
        us = users.get(n.name, ())
        if us and all(graph.node(u).op not in MIXING_OPS and u in head for u in us):
            head.add(n.name)
    return head


@dataclass
class Calibration:
    """Chosen range per tensor, with what produced it."""

    method: str
    samples: str
    count: int
    ranges: dict[str, tuple[float, float]]
    observed: dict[str, tuple[float, float]]
    percentile: float | None = None


def calibrate(graph: Graph, samples: Samples, method: str = "minmax",
              percentile: float = DEFAULT_PERCENTILE) -> Calibration:
    """Ranges of every float tensor of ``graph`` (typed, canonical) over ``samples``."""
    if method not in METHODS:
        raise UsageError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    if not 50.0 < percentile <= 100.0:
        raise UsageError(f"--percentile must be in (50, 100], got {percentile}")
    if len(samples) == 0:
        raise UsageError("no calibration inputs (an empty set)")
    names = calibrated_names(graph)
    stats = {n: TensorStats() for n in names}
    for values in _run_all(graph, names, samples):
        for n, a in values.items():
            if not np.isfinite(a).all():
                raise UsageError(f"calibration: tensor %{n} holds NaN/inf on a calibration input "
                                 "(the FP32 model overflows on this data)")
            stats[n].add_minmax(a)
    if method != "minmax":
        for values in _run_all(graph, names, samples):
            for n, a in values.items():
                stats[n].add_hist(a)
    head = output_head(graph)
    ranges = {n: (s.lo, s.hi) if n in head else _range_of(s, method, percentile)
              for n, s in stats.items()}
    return Calibration(method, samples.source, len(samples), ranges,
                       {n: (s.lo, s.hi) for n, s in stats.items()},
                       percentile if method == "percentile" else None)
