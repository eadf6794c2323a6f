"""Argument helpers shared by commands: workload selection, database, threads, tables."""
from __future__ import annotations

import argparse
import json
import sys


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", metavar="KIND", help="workload kind (gemm), or a workload key "
                   "('kind:{json}', as `tasks --keys` prints) for a model's fused group")
    p.add_argument("--shape", help="GEMM shape MxNxK, e.g. 1024x1024x1024")
    p.add_argument("--dtype", default="float32",
                   help="float32 (default), float64, int32, or int8 (A uint8 x B int8 -> C int32; "
                        "int8w7: weights promised in [-64, 64])")


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="SQLAlchemy URL of the records database "
                                "(default: $TUNER_DB or sqlite:///logs/tuning.db)")


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="thread budget (default: all usable cores)")


def add_input_shape_args(p: argparse.ArgumentParser) -> None:
    """``--input-shape``: the symbolic input dimensions of an ONNX model."""
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                   help="an ONNX input's shape, e.g. data=8x3x224x224: sets the model's symbolic "
                        "dimensions (a symbolic first one is 1 otherwise; the fixed ones must "
                        "match); repeat for several inputs")


def input_shapes(args) -> dict:
    """``{"shapes": {name: shape}}`` from ``--input-shape`` (empty without one), for
    ``tuner.frontend.load_model``."""
    from workloads.errors import UsageError

    shapes = {}
    for text in getattr(args, "input_shape", None) or []:
        name, sep, dims = text.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) < 1:
            raise UsageError(f"--input-shape wants NAME=DIMS with positive sizes, e.g. "
                             f"data=1x3x224x224; got {text!r}")
        if name in shapes:
            raise UsageError(f"--input-shape gives {name!r} twice")
        shapes[name] = shape
    return {"shapes": shapes} if shapes else {}


def model_graph(args, path: str | None = None, seed: int | None = None):
    """The graph of ``path`` (default ``args.model``), its input shapes from ``--input-shape``;
    an ``.onnx`` model with its float weights replaced by ``seed``'s random
    ones (``--random-weights``) when ``seed`` is given."""
    from tuner.frontend import load_model
    from workloads.errors import UsageError

    path = path or args.model
    shapes = input_shapes(args)
    if seed is None:
        return load_model(path, **shapes)
    if not path.endswith(".onnx"):
        raise UsageError("--random-weights applies to .onnx models")
    from tuner.compiler.verify_model import prepare
    return prepare(path, seed, **shapes)[1]


def threads_of(args) -> int:
    from tuner.target import thread_count

    return thread_count(args.threads, "--threads ")


def workload_of(args):
    """The workload named on the command line; every bad input is a one-line UsageError."""
    import workloads
    from workloads.errors import UsageError

    if ":" in args.kind:   # a workload key: the shape is in it
        if args.shape:
            raise UsageError("a workload key carries its shapes; drop --shape")
        return workloads.from_spec(args.kind)
    cls = workloads.workload_class(args.kind)
    if not args.shape:
        raise UsageError(f"{args.kind} needs --shape, e.g. --shape 1024x1024x1024")
    return cls.parse_spec(f"{args.shape}:{args.dtype}")


def open_store(args, create: bool = True):
    from tuner.dispatch import open_store as _open

    return _open(getattr(args, "db", None), create=create)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_table(rows: list[dict], columns: list[str]) -> None:
    if not rows:
        print("(no rows)")
        return
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"
