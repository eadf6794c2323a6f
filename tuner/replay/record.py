"""Record a replay table with the real measurement pipeline.

    python -m tuner.replay.record --shape 256x256x256 --configs 500 --out workloads/tables/gemm-256x256x256.jsonl.gz
    python -m tuner.replay.record --workload 'conv2d:{...}' --configs 300 --out workloads/tables/conv2d-NAME.jsonl.gz
    python -m tuner.replay.record --import-table gemm-256x256x256 --db sqlite:///logs/tuning.db

``--workload`` takes any workload key (``python -m tuner tasks MODEL --keys`` prints a
model's), recorded with the kind's template unless ``--template`` names another.

A uniform random sample of the template's valid configs (thread budget ``--threads``,
default 1), plus a few random points of the full product that violate the constraints
(recorded as INVALID, so tables exercise that path), measured by ``Measurer`` in batches
with the tuner's cut-short rule (a candidate 10x slower than the best so far keeps one
sample). Rows are appended to ``OUT.partial`` as they are measured; the gzipped table is
written at the end (or when ``--time-budget`` runs out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path

from search_spaces import get_template
from search_spaces.space import Config
from tuner.replay.table import FORMAT, FORMAT_VERSION, Row, Table, knob_header, row_dict
from tuner.measure.result import Status


def sample_configs(space, n_valid: int, n_invalid: int, seed: int) -> list[Config]:
    rng = random.Random(seed)
    seen: set[Config] = set()
    out: list[Config] = []
    tries = 0
    while len(out) < n_valid and tries < 200 * n_valid:
        tries += 1
        cfg = space.sample(rng)
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    bad: list[Config] = []
    while len(bad) < n_invalid and tries < 400 * n_valid:
        tries += 1
        cfg = space.get(rng.randrange(space.size))
        if cfg not in seen and not space.is_valid(cfg):
            seen.add(cfg)
            bad.append(cfg)
    mixed = out + bad
    rng.shuffle(mixed)
    return mixed


def _source_sha1(template) -> str:
    """sha1 of the template's module source: a template edited without a version bump still
    gets a distinguishable table (the header's knob list is what a replay relies on)."""
    import hashlib
    import inspect

    try:
        return hashlib.sha1(inspect.getsource(inspect.getmodule(type(template))).encode()).hexdigest()[:12]
    except (OSError, TypeError):
        return ""


def import_table(table: Table, store, target) -> int:
    """Write a table's rows into a records store as trials of one run (command "replay
    import"), so transfer and the similar-workload fallback can use them. Refused when the
    table was recorded on another target. Returns the number of rows written."""
    from tuner.db.store import TrialRecord
    from workloads.errors import UsageError
    from workloads import workload_class

    if table.header["target"]["key"] != target.key:
        raise UsageError(f"table {table.name} was recorded on {table.header['target']['key']}, "
                         f"not this target {target.key}; not imported")
    wh = table.header["workload"]
    w = workload_class(wh["kind"]).from_params(wh["params"])
    tmpl, threads = table.header["template"], table.header["threads"]
    run = store.start_run(target, f"replay import {table.name}", "random", threads)
    store.add_trials(run, w, target, [
        TrialRecord(tmpl["name"], tmpl["version"], r.config, threads, r.result(), "replay-import")
        for r in table.rows])
    store.finish_run(run, summary={"imported": len(table.rows), "table": table.name})
    return len(table.rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.replay.record")
    p.add_argument("--import-table", metavar="TABLE", default=None,
                   help="instead of recording: write TABLE's rows into --db as trials")
    p.add_argument("--db", default=None, help="records database for --import-table")
    p.add_argument("--shape", help="a GEMM shape MxNxK")
    p.add_argument("--workload", metavar="KEY", help="any workload key, e.g. a model task's")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--template", default=None, help="default: the workload kind's template")
    p.add_argument("--configs", type=int, default=500, help="valid configs to sample")
    p.add_argument("--invalid", type=int, default=20, help="constraint-violating points to add")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--build-workers", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--min-repeat-ms", type=float, default=20.0)
    p.add_argument("--max-time-s", type=float, default=1.0)
    p.add_argument("--run-timeout", type=float, default=30.0)
    p.add_argument("--time-budget", type=float, default=1200.0, help="seconds; stop sampling after")
    p.add_argument("--out")
    a = p.parse_args(argv)
    if a.import_table:
        from tuner.dispatch import open_store
        from tuner.target import host_target

        n = import_table(Table.load(a.import_table), open_store(a.db), host_target())
        print(f"imported {n} rows of {a.import_table}")
        return 0
    if not ((a.shape or a.workload) and a.out):
        p.error("recording needs --shape or --workload, and --out")

    from workloads.errors import UsageError
    from tuner.measure.measurer import MeasureOptions, Measurer
    from tuner.target import host_target
    from workloads import from_key
    from workloads.gemm import Gemm

    try:
        w = from_key(a.workload) if a.workload else Gemm.parse(a.shape, a.dtype)
    except UsageError as exc:
        p.error(str(exc))
    template = get_template(a.template or w.kind)
    space = template.space(w, a.threads)
    target = host_target()
    configs = sample_configs(space, a.configs, a.invalid, a.seed)
    mopts = MeasureOptions(threads=a.threads, repeat=a.repeat, min_repeat_ms=a.min_repeat_ms,
                           max_time_s=a.max_time_s, run_timeout=a.run_timeout,
                           build_workers=a.build_workers)
    header = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "workload": {"kind": w.kind, "key": w.key, "params": w.params(), "flops": w.flops()},
        "template": {"name": template.name, "version": template.version,
                     "source_sha1": _source_sha1(template)},
        "threads": a.threads, "knobs": knob_header(space),
        "target": {"key": target.key, "cpu_name": target.cpu_name, "model_name": target.model_name,
                   "caches": dict(target.caches)},
        "versions": dict(target.versions),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sampling": {"method": "uniform over valid configs + constraint-violating points",
                     "valid_requested": a.configs, "invalid_requested": a.invalid, "seed": a.seed},
        "measure_options": {k: getattr(mopts, k) for k in ("repeat", "min_repeat_ms", "max_time_s",
                                                           "run_timeout", "build_timeout")},
        "cutoff_factor": 10.0,
    }
    out = Path(a.out)
    partial = out.with_name(out.name + ".partial")
    rows: list[Row] = []
    t0 = time.perf_counter()
    best = None
    with Measurer(mopts) as measurer, open(partial, "w") as log:
        for i in range(0, len(configs), a.batch):
            if time.perf_counter() - t0 > a.time_budget:
                print(f"time budget reached after {len(rows)} configs", file=sys.stderr)
                break
            batch = configs[i:i + a.batch]
            results = measurer.measure(w, template, batch, cutoff_s=best * 10 if best else None)
            for cfg, r in zip(batch, results):
                row = Row(cfg, r.status, list(r.samples), r.compile_time, r.error)
                rows.append(row)
                log.write(json.dumps(row_dict(row), sort_keys=True) + "\n")
                if r.ok and (best is None or r.median < best):
                    best = r.median
            log.flush()
            ok = sum(1 for r in rows if r.status is Status.OK)
            gf = w.flops() / best / 1e9 if best else 0.0
            print(f"{len(rows)}/{len(configs)} measured, {ok} OK, best {gf:.1f} GFLOPS, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    header["recording_seconds"] = round(time.perf_counter() - t0, 1)
    Table(header, rows).save(out)
    partial.unlink(missing_ok=True)
    print(f"wrote {out}: {len(rows)} rows in {header['recording_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
