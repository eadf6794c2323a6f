"""How many compiled modules a model's build needs (docs/compile-once.md).

``python -m tuner.bench.module_sharing MODEL... [--threads N]``: plans every model's kernels
with the template defaults (as an untuned build does, nothing compiled) and counts, per
template, the kernels and the distinct module sources (content addresses) they need, and
the distinct (module, argument types) pairs Numba compiles. Shape-generic templates give
layers that share a micro-kernel variant one module. Load-independent: nothing is timed.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict


def count(path: str, threads: int = 1) -> dict:
    """{template: (kernels, distinct modules, distinct compiled signatures)} for one model,
    plus the totals under ``"all"``."""
    from tuner.compiler.compile_model import compiled_kernels, pipeline
    from tuner.frontend import load_model

    g = pipeline(load_model(path))  # the default level, as `build` runs it
    kernels = compiled_kernels(g, threads=threads, tuned=False)   # what `build` compiles
    per: dict[str, list[set | int]] = defaultdict(lambda: [0, set(), set()])
    for k in kernels.values():
        if k.path is None:
            continue
        specs = tuple((len(s), str(d)) for s, d in k.workload.input_specs() + k.workload.output_specs())
        for key in (k.template.name, "all"):
            row = per[key]
            row[0] += 1
            row[1].add(k.path)
            row[2].add((k.path, specs))
    return {t: (n, len(mods), len(sigs)) for t, (n, mods, sigs) in sorted(per.items())}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.bench.module_sharing",
                                description=__doc__.strip().splitlines()[0])
    p.add_argument("models", nargs="+", metavar="MODEL")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    print(f"{'model':28s} {'template':18s} {'kernels':>8s} {'modules':>8s} {'compiles':>8s}")
    for path in args.models:
        name = path.rsplit("/", 1)[-1]
        for tpl, (n, mods, sigs) in count(path, args.threads).items():
            print(f"{name:28s} {tpl:18s} {n:8d} {mods:8d} {sigs:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
