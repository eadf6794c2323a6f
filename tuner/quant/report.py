"""FP32 vs INT8: per quantized op and end to end.

For every 8-bit value a quantized op produces, the FP32 graph's value of the same tensor is
compared with the INT8 graph's value dequantized, accumulated over all report inputs:
ranges, means, standard deviations, max abs error, SQNR (``20 log10(|x| / |x - y|)`` over
all values, dB), cosine similarity, and the saturation ratio (share of FP32 values outside
the representable range [(qmin - zp) * s, (qmax - zp) * s] widened by half a step, i.e.
clamped; "fp32" for an anchor whose requantize outputs float32). End to end, on the first graph output flattened per sample: top-1 agreement
(same argmax) and top-5 agreement (the FP32 top-1 class is among the INT8 top 5), and,
when the inputs carry labels, both models' accuracy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workloads.graph.executor import execute
from workloads.graph.ir import Graph
from workloads.graph.ops.quant import clamp_bounds
from workloads.graph.passes.quantize import QuantizedGraph
from tuner.quant.calibrate import Samples


@dataclass
class _Acc:
    n: int = 0
    lo: float = np.inf
    hi: float = -np.inf
    s: float = 0.0
    s2: float = 0.0

    def add(self, a: np.ndarray) -> None:
        a = a.astype(np.float64).reshape(-1)
        if not a.size:
            return
        self.n += a.size
        self.lo, self.hi = min(self.lo, a.min()), max(self.hi, a.max())
        self.s += a.sum()
        self.s2 += (a * a).sum()

    def summary(self) -> dict:
        mean = self.s / max(self.n, 1)
        return {"min": float(self.lo), "max": float(self.hi), "mean": float(mean),
                "std": float(np.sqrt(max(self.s2 / max(self.n, 1) - mean * mean, 0.0)))}


@dataclass
class OpStats:
    tensor: str
    ops: str
    scale: float | None       # None: the INT8 graph computes this tensor in float32
    zero_point: int
    qmin: int
    qmax: int
    fp: _Acc = field(default_factory=_Acc)
    q: _Acc = field(default_factory=_Acc)
    err2: float = 0.0
    dot: float = 0.0
    max_err: float = 0.0
    saturated: int = 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        x64, y64 = x.astype(np.float64).reshape(-1), y.astype(np.float64).reshape(-1)
        self.fp.add(x64)
        self.q.add(y64)
        d = x64 - y64
        self.err2 += float((d * d).sum())
        self.dot += float((x64 * y64).sum())
        self.max_err = max(self.max_err, float(np.abs(d).max(initial=0.0)))
        if self.scale is not None:
            lo = (self.qmin - self.zero_point - 0.5) * self.scale
            hi = (self.qmax - self.zero_point + 0.5) * self.scale
            self.saturated += int(((x64 < lo) | (x64 > hi)).sum())

    def to_dict(self) -> dict:
        sig = self.fp.s2
        sqnr = float("inf") if self.err2 == 0 else 10 * np.log10(max(sig, 1e-300) / self.err2)
        den = np.sqrt(self.fp.s2 * self.q.s2)
        return {"tensor": self.tensor, "ops": self.ops, "scale": self.scale,
                "zero_point": self.zero_point, "fp32": self.fp.summary(), "int8": self.q.summary(),
                "max_abs_error": self.max_err, "sqnr_db": sqnr,
                "cosine": float(self.dot / den) if den > 0 else (1.0 if self.err2 == 0 else 0.0),
                "saturation": self.saturated / max(self.fp.n, 1)}


def _topk(v: np.ndarray, k: int) -> np.ndarray:
    k = min(k, v.shape[1])
    return np.argsort(-v, axis=1, kind="stable")[:, :k]


def compare(fp_graph: Graph, q: QuantizedGraph, samples: Samples) -> dict:
    """The report dict (see the module docstring) over ``samples``."""
    qg = q.graph
    rows: list[OpStats] = []
    for c in q.chains:
        qname = q.qnames[c.out]
        node = qg.node(qname)
        ops = "+".join(fp_graph.node(m).op for m in c.nodes)
        if node.type.is_float:   # requantize to float32: nothing clamps
            rows.append(OpStats(c.out, ops, None, 0, 0, 0))
            continue
        p = q.params[c.out]
        lo, hi = clamp_bounds(node.attrs) if node.op in ("requantize", "qadd") else (0, 255)
        if node.op == "clip":
            lo, hi = int(node.attrs["a_min"]), int(node.attrs["a_max"])
        rows.append(OpStats(c.out, ops, p.scale, p.zero_point, lo, hi))
    fp_names = list(fp_graph.outputs) + [r.tensor for r in rows]
    q_names = list(qg.outputs) + [q.qnames[r.tensor] for r in rows]
    fpg = fp_graph.replace(outputs=tuple(dict.fromkeys(fp_names)))
    qgg = qg.replace(outputs=tuple(dict.fromkeys(q_names)))
    out_fp, out_q, out_stats = [], [], OpStats(fp_graph.outputs[0], "output", None, 0, 0, 0)
    for inputs in samples.inputs:
        fv = dict(zip(fpg.outputs, execute(fpg, inputs)))
        qv = dict(zip(qgg.outputs, execute(qgg, inputs)))
        for r in rows:
            v = qv[q.qnames[r.tensor]]
            r.add(fv[r.tensor], v if r.scale is None else q.params[r.tensor].dequantize(v))
        a, b = fv[fp_graph.outputs[0]], qv[qg.outputs[0]]
        out_stats.add(a, b)
        batch = a.shape[0] if a.ndim > 1 else 1
        out_fp.append(a.reshape(batch, -1))
        out_q.append(b.reshape(batch, -1))
    fa, qa = np.concatenate(out_fp), np.concatenate(out_q)
    top1_fp, top5_q = _topk(fa, 1)[:, 0], _topk(qa, 5)
    e2e = {"output": fp_graph.outputs[0], "samples": len(samples), "rows": int(fa.shape[0]),
           "classes": int(fa.shape[1]),
           "top1_agreement": float(np.mean(top1_fp == top5_q[:, 0])),
           "top5_agreement": float(np.mean((top5_q == top1_fp[:, None]).any(axis=1))),
           "sqnr_db": out_stats.to_dict()["sqnr_db"], "cosine": out_stats.to_dict()["cosine"],
           "max_abs_error": out_stats.max_err}
    if samples.labels is not None and samples.labels.shape[0] == fa.shape[0]:
        e2e["accuracy_fp32"] = float(np.mean(top1_fp == samples.labels))
        e2e["accuracy_int8"] = float(np.mean(top5_q[:, 0] == samples.labels))
    return {"ops": [r.to_dict() for r in rows], "end_to_end": e2e,
            "inputs": samples.source}


def format_report(rep: dict) -> str:
    """The report as a table (one row per quantized op), then end to end and coverage."""
    lines = [f"{'tensor':<28} {'ops':<22} {'fp32 range':>21} {'int8 range':>21} "
             f"{'fp32 mean/std':>17} {'max err':>9} {'SQNR dB':>8} {'cosine':>8} {'sat %':>6}"]
    for r in rep["ops"]:
        f, q = r["fp32"], r["int8"]
        name = r["tensor"] if len(r["tensor"]) <= 28 else "…" + r["tensor"][-27:]
        lines.append(
            f"{name:<28} {r['ops'][:22]:<22} {f['min']:>10.3g},{f['max']:<10.3g} "
            f"{q['min']:>10.3g},{q['max']:<10.3g} {f['mean']:>8.3g}/{f['std']:<8.3g} "
            f"{r['max_abs_error']:>9.3g} {r['sqnr_db']:>8.2f} {r['cosine']:>8.5f} "
            + (f"{100 * r['saturation']:>6.3f}" if r["scale"] is not None else f"{'fp32':>6}"))
    e = rep["end_to_end"]
    lines.append("")
    lines.append(f"end to end ({e['samples']} inputs: {rep['inputs']}; output %{e['output']}, "
                 f"{e['classes']} classes): top-1 agreement {100 * e['top1_agreement']:.2f}%, "
                 f"top-5 agreement {100 * e['top5_agreement']:.2f}%, output SQNR "
                 f"{e['sqnr_db']:.2f} dB, cosine {e['cosine']:.5f}")
    if "accuracy_fp32" in e:
        lines.append(f"accuracy on the labels: FP32 {100 * e['accuracy_fp32']:.2f}%, "
                     f"INT8 {100 * e['accuracy_int8']:.2f}% "
                     f"({100 * (e['accuracy_int8'] - e['accuracy_fp32']):+.2f} points)")
    return "\n".join(lines)


def format_coverage(cov: dict) -> str:
    lines = [f"coverage: {cov['ops_quantized']} ops quantized, {cov['ops_fp32']} left in FP32 "
             f"({100 * cov['share_quantized']:.1f}% quantized); conversions: "
             f"{cov['quantize_ops']} quantize + {cov['dequantize_ops']} dequantize = "
             f"{cov['conversions']}"]
    lines.append("  quantized: " + (", ".join(f"{k} x{v}" for k, v in cov["quantized_by_op"].items()) or "none"))
    if cov["fp32_by_op"]:
        lines.append("  FP32:      " + ", ".join(f"{k} x{v}" for k, v in cov["fp32_by_op"].items()))
        for node, why in cov["fp32_reasons"].items():
            lines.append(f"    %{node}: {why}")
    return "\n".join(lines)
