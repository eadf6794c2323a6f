"""``bench tiles``: a model's heaviest tasks, each template default against config variants.

How the per-layer A/Bs behind the templates' defaults are taken (docs/isa.md): for each task
of a model (``extract_tasks`` at the build's pass level, heaviest first), the default config
and each variant (the default with the variant's knobs replaced, then ``repair``-ed to the
space's rules) are timed by the tuning worker in one batch, then again in the opposite order;
each config keeps the better of its two medians (this VM's slow streaks last longer than a
batch: a one-order A/B had shown 1.24x "wins" the reverse order did not repeat). A ratio is
default time / variant time (> 1: the variant is faster); a variant the space refuses, one
equal to the default after repair, or one that failed has none, and its cell says which
("refused", "= default", or the failure's status). ``rows``: only tasks whose GEMM has that many
rows (M = 49: the 7 x 7 layers).
"""
from __future__ import annotations

import json
from typing import Sequence

from workloads.errors import UsageError


def parse_variants(text: str) -> list[dict]:
    try:
        variants = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--variants must be a JSON list of objects, got {text!r} ({exc})") from None
    if not isinstance(variants, list) or not variants or not all(isinstance(v, dict) and v for v in variants):
        raise UsageError(f"--variants must be a non-empty JSON list of non-empty objects, got {text!r}")
    return variants


def variant_config(template, space, default, changes: dict):
    """The default with ``changes``, repaired to the space; "refused" where the space cannot
    hold it, "= default" where the repair gives the default back."""
    from search_spaces.gemm_engine.space import repair

    unknown = set(changes) - {k.name for k in space.knobs}
    if unknown:
        raise UsageError(f"unknown knob(s) {sorted(unknown)} for template {template.name}; "
                         f"knobs: {', '.join(k.name for k in space.knobs)}")
    try:
        cfg = repair(space, {**default, **changes})
    except Exception:  # noqa: BLE001 - a value the space cannot hold: no row for it
        return "refused"
    if space.violation(cfg):
        return "refused"
    return "= default" if cfg == default else cfg


def bench_tiles(graph, variants: Sequence[dict], *, threads: int = 1, tasks: int = 12,
                kind: str = "conv2d", rows: int | None = None, opt_level: int | None = None, mopts=None,
                cache_flush: bool = False, log=print) -> dict:
    from search_spaces import get_template
    from tuner.bench.hotspots import gemm_equivalent, gemm_label
    from tuner.measure.measurer import MeasureOptions, Measurer
    from tuner.target import host_target
    from tuner.tasks import extract_tasks

    mopts = mopts or MeasureOptions(threads=threads, placements=2, repeat=6, min_repeat_ms=30,
                                    max_time_s=2.0, cache_flush=cache_flush)
    picked = [t for t in extract_tasks(graph, opt_level=opt_level, threads=threads)
              if t.workload.kind == kind
              and (rows is None or (gemm_equivalent(t.key) or (0, 0))[1] == rows)][:tasks]
    if not picked:
        raise UsageError(f"{graph.name} has no {kind} task" + (f" with {rows} GEMM rows" if rows else ""))
    rows = []
    with Measurer(mopts) as m:
        for t in picked:
            tpl = get_template(t.template)
            space = tpl.space(t.workload, threads)
            default = tpl.default_config(t.workload, threads)
            cfgs = [default] + [variant_config(tpl, space, default, v) for v in variants]
            batch = [c for c in cfgs if not isinstance(c, str)]
            best: dict[str, float] = {}
            errors: dict[str, str] = {}
            for order in (batch, batch[::-1]):
                for c, r in zip(order, m.measure(t.workload, tpl, order)):
                    if r.ok:
                        best[c.hash] = min(best.get(c.hash, float("inf")), r.median)
                    else:
                        errors[c.hash] = f"{r.status.value}: {r.error[:200]}"
            base = best.get(default.hash)
            row = {"key": t.key, "occurrences": t.occurrences, "template": tpl.name,
                   "gemm": gemm_label(gemm_equivalent(t.key)) or "-", "default": dict(default),
                   "default_s": base, "variants": []}
            for v, c in zip(variants, cfgs[1:]):
                timed = not isinstance(c, str)
                s = best.get(c.hash) if timed else None
                row["variants"].append({"changes": v, "config": dict(c) if timed else None,
                                        "seconds": s, "error": errors.get(c.hash) if timed else None,
                                        "ratio": base / s if base and s else None,
                                        "skipped": None if timed else c})
            rows.append(row)
            log(row_line(row))
    return {"kind": "bench-tiles", "model": graph.name, "threads": threads, "opt_level": opt_level,
            "cache_flush": mopts.cache_flush,
            "variants": list(variants), "target": host_target().to_dict(), "rows": rows}


def row_line(row: dict) -> str:
    d = row["default"]
    tile = f"{d.get('mr')} x {d.get('nr')}" if "mr" in d else "-"
    ratios = " | ".join(_cell(v) for v in row["variants"])
    ms = f"{row['default_s'] * 1e3:.3f}" if row["default_s"] else "-"
    return f"| {row['gemm']} x{row['occurrences']} | {tile} | {ms} | {ratios} |"


def _cell(v: dict) -> str:
    """A variant's ratio, or why it has none."""
    if v["ratio"]:
        return f"{v['ratio']:.2f}"
    if v.get("skipped"):
        return v["skipped"]
    if v.get("error"):
        return v["error"].split(":", 1)[0]
    return "-"


def tiles_markdown(data: dict) -> str:
    names = [json.dumps(v, separators=(",", ":")) for v in data["variants"]]
    head = ["| task (GEMM x occurrences) | default tile | default ms | " + " | ".join(names) + " |",
            "|---|---|---|" + "---|" * len(names)]
    return "\n".join(head + [row_line(r) for r in data["rows"]])
