"""``python -m tuner passes FILE``: run the graph pass pipeline and show what it does.

Prints, for each pass, its time, node counts and the bytes of intermediate tensors the graph
writes and reads; then the fused groups and what fusion saves. ``--dump`` prints the IR
before the pipeline and after each pass (large constants elided).
"""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from tuner.cli.common import add_input_shape_args

    p = subparsers.add_parser(
        "passes", help="run graph passes on a model graph and show the IR after each",
        description="Run the default pass pipeline of an opt level on a model (.onnx or the "
                    "IR text form) and report what each pass did.")
    p.add_argument("file", metavar="FILE", help="model: .onnx or graph in IR text form "
                   "(docs/graph-ir.md)")
    add_input_shape_args(p)
    p.add_argument("--opt-level", "-O", type=int, default=None, choices=range(4), metavar="N",
                   help="0..3 (default as build: 3, 2 for a quantized graph); "
                        "see README for the passes of each level")
    p.add_argument("--dump", action="store_true", help="print the IR before and after each pass")
    p.add_argument("--disable", action="append", default=[], metavar="PASS",
                   help="skip a pass by name (repeatable, or comma-separated)")
    p.add_argument("--layout", default="NHWC", choices=("NCHW", "NHWC"),
                   help="ConvertLayout target at opt level 3 (default NHWC)")
    p.add_argument("--max-group-size", type=int, default=None, metavar="K",
                   help="FuseOps: at most K ops per fused group (default 16)")
    p.add_argument("--full-constants", action="store_true",
                   help="with --dump, print constants in full (output parses back)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from workloads.errors import UsageError
    from workloads.graph.analysis import graph_stats, human_bytes
    from workloads.graph.fusion import describe, fused_groups
    from workloads.graph.passes import DumpIR, PassContext, PassRecorder, pipeline_passes, Sequential
    from workloads.graph.passes.pipeline import DEFAULT_MAX_GROUP_SIZE
    from workloads.graph.text import to_text

    from tuner.cli.common import model_graph
    from tuner.compiler.compile_model import default_opt_level

    graph = model_graph(args, args.file)
    args.opt_level = default_opt_level(graph, args.opt_level)
    disabled = {d.strip() for item in args.disable for d in item.split(",") if d.strip()}
    if args.max_group_size is not None and args.max_group_size < 1:
        raise UsageError(f"--max-group-size must be >= 1, got {args.max_group_size}")
    out = sys.stdout
    recorder = PassRecorder()
    instruments = [recorder]
    if args.dump:
        out.write(f"# ---- IR before passes\n{to_text(graph, elide=not args.full_constants)}\n")
        instruments.append(DumpIR(after=True, stream=out, elide=not args.full_constants))
    ctx = PassContext(opt_level=args.opt_level, disabled=frozenset(disabled),
                      instruments=tuple(instruments))
    passes = pipeline_passes(args.opt_level, layout=args.layout,
                             max_group_size=args.max_group_size or DEFAULT_MAX_GROUP_SIZE)
    final = Sequential(passes, name=f"O{args.opt_level}")(graph, ctx)

    s0 = graph_stats(graph)
    out.write(f"graph {graph.name} ({args.file}), opt level {args.opt_level}: "
              f"{s0.inputs} inputs, {s0.constants} constants, {s0.ops} ops\n\n")
    out.write(f"{'pass':<24}{'ms':>8} {'nodes':>6} {'ops':>5} {'fused':>6} {'written':>10} {'read':>10}\n")
    out.write(f"{'(input)':<24}{'':>8} {s0.row()}\n")
    before_fuse = s0
    prev = graph
    for p, g, seconds, skipped in recorder.events:
        if g is None:
            out.write(f"{p.name:<24}{'-':>8}  skipped ({skipped})\n")
            continue
        s = graph_stats(g)
        mark = "" if g != prev else "  (unchanged)"
        out.write(f"{p.name:<24}{seconds * 1e3:8.2f} {s.row()}{mark}\n")
        if p.name != "FuseOps":
            before_fuse = s
        prev = g

    groups = fused_groups(final)
    out.write(f"\nfused groups ({len(groups)}):\n")
    for node in groups:
        d = describe(node)
        ins = ", ".join(str(t) for t in d.inputs)
        out.write(f"  %{d.name:<16} {node.body.name:<32} {d.summary()}\n"
                  f"  {'':<17}({ins}) -> {d.output}\n")
    s1 = graph_stats(final)
    out.write("\nintermediate tensors (bytes written / read):\n")
    out.write(f"  input graph       {human_bytes(s0.written):>10} / {human_bytes(s0.read)}\n")
    out.write(f"  before FuseOps    {human_bytes(before_fuse.written):>10} / {human_bytes(before_fuse.read)}\n")
    out.write(f"  after pipeline    {human_bytes(s1.written):>10} / {human_bytes(s1.read)}\n")
    saved_w, saved_r = before_fuse.written - s1.written, before_fuse.read - s1.read
    out.write(f"  fusion saves      {human_bytes(saved_w):>10} / {human_bytes(saved_r)}\n")
    return 0
