"""Per layer: the int8 anchors' requantize in a separate pass against the requantize in the
micro-kernel's registers (``quant_anchor``'s ``requantize`` knob), alternating A/B.

    python -m tuner.bench.requantize_ab [--layouts NHWC,NCHW] [--rounds 7] [--calls 20]

Each layer is a ResNet-50 stage-2 convolution (56 x 56 output, batch 1) with its requantize
to uint8 (and the residual ``qadd`` where ResNet-50 has one), built in the graph IR as the
Quantize pass groups it. Both configs are the template default with only ``requantize``
changed; the prepared form (``kernel_prepared``, what a build calls) is timed, after an
exactness check of both against the integer reference. A round times ``calls`` calls of A
then of B in process CPU time (``time.process_time``: steadier than wall time on a shared
machine); the figure is the median over rounds, per call in ms. A layout or layer with no
register form (NCHW before it has one) prints its reason instead of a B figure.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

# (name, input channels, output channels, kernel, residual qadd)
LAYERS = [
    ("1x1 64->64 (3136 x 64 x 64)", 64, 64, 1, False),
    ("1x1 64->256 + residual (3136 x 256 x 64)", 64, 256, 1, True),
    ("3x3 64->64 (3136 x 64 x 576)", 64, 64, 3, False),
    ("1x1 256->64 (3136 x 64 x 256)", 256, 64, 1, False),
]


def layer_workload(layout: str, C: int, O: int, k: int, residual: bool, hw: int = 56):
    """The fused group (qconv2d -> requantize [-> qadd]) as the Quantize pass makes it."""
    from workloads.fused import workload_for_group
    from workloads.graph import GraphBuilder
    from workloads.graph.fusion import fused_groups
    from workloads.graph.passes import optimize

    kl = "OIHW" if layout == "NCHW" else "HWIO"
    b = GraphBuilder("layer")
    x = b.input("x", (1, C, hw, hw) if layout == "NCHW" else (1, hw, hw, C), "uint8")
    w = b.const(np.zeros((O, C, k, k) if kl == "OIHW" else (k, k, C, O), np.int8))
    acc = b.op("qconv2d", x, w, x_zero_point=3, w_max=64, padding=(k // 2,) * 4,
               data_layout=layout, kernel_layout=kl)
    y = b.op("requantize", acc, b.const(np.zeros(O, np.int32)), b.const(np.full(O, 0.01, np.float32)),
             axis=layout.index("C"), zero_point=0)
    if residual:
        other = b.input("r", tuple(y.type.shape), "uint8")
        y = b.op("qadd", y, other, a_zero_point=0, a_mul=0.5, b_zero_point=0, b_mul=0.7, zero_point=0)
    g = optimize(b.build(y), opt_level=2)
    (node,) = [n for n in fused_groups(g) if n.body is not None
               and any(m.op == "qconv2d" for m in n.body.nodes)]
    return workload_for_group(node)


def _prepared(w, t, cfg):
    from search_spaces.template import kernel_source, prepare_kernel
    from tuner.measure.kernel_key import import_kernel_module
    from tuner.measure.measurer import write_source

    mod = import_kernel_module(write_source(kernel_source(t, w, cfg), template=t))
    x = w.make_inputs(0)
    pk = prepare_kernel(mod, t.prepared_inputs(w, cfg), x)
    out = w.make_outputs()
    pk(*x, *out)
    err = w.check(x, out, w.reference(x))
    if err is not None:
        raise AssertionError(f"{cfg['requantize']}: {err}")
    return lambda: pk(*x, *out)


def _cpu_ms(fn, calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) * 1e3 / calls


def run(layouts, rounds: int, calls: int, out=sys.stdout) -> list[dict]:
    from search_spaces import get_template

    rows = []
    print("| layout | layer | separate pass CPU ms | in registers CPU ms | pass / registers |", file=out)
    print("|---|---|---|---|---|", file=out)
    for layout in layouts:
        for name, C, O, k, residual in LAYERS:
            w = layer_workload(layout, C, O, k, residual)
            t = get_template(w.kind)
            base = t.default_config(w, 1)
            a_cfg, b_cfg = base.replace(requantize="pass"), base.replace(requantize="registers")
            reason = t.space(w, 1).violation(b_cfg)
            a = _prepared(w, t, a_cfg)
            b = None if reason else _prepared(w, t, b_cfg)
            ta, tb = [], []
            for _ in range(rounds):
                ta.append(_cpu_ms(a, calls))
                if b is not None:
                    tb.append(_cpu_ms(b, calls))
            ma = statistics.median(ta)
            mb = statistics.median(tb) if tb else None
            rows.append({"layout": layout, "layer": name, "pass_ms": ma, "registers_ms": mb,
                         "reason": reason})
            right = f"{mb:.3f} | {ma / mb:.2f}x" if mb else f"- ({reason}) | -"
            print(f"| {layout} | {name} | {ma:.3f} | {right} |", file=out, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.bench.requantize_ab", description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="NHWC,NCHW", help="comma-separated: NHWC, NCHW")
    ap.add_argument("--rounds", type=int, default=7, help="alternating A/B rounds (median)")
    ap.add_argument("--calls", type=int, default=20, help="calls per contender per round")
    args = ap.parse_args(argv)
    layouts = [s.strip().upper() for s in args.layouts.split(",") if s.strip()]
    bad = [s for s in layouts if s not in ("NHWC", "NCHW")]
    if bad or args.rounds < 1 or args.calls < 1:
        print(f"error: layouts are NHWC/NCHW and rounds, calls >= 1 (got {args.layouts!r}, "
              f"{args.rounds}, {args.calls})", file=sys.stderr)
        return 2
    run(layouts, args.rounds, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
