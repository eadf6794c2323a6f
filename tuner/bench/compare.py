"""``bench compare``: the best configs of several tuning runs (databases), re-measured side by side.

A tuning run scores its best under whatever load it ran in, so two runs' recorded times cannot
be compared. Here the config each database dispatches for one workload (this target, one
thread count, the current template version: its best record, or the template's default where
the best did not beat it side by side, ``dispatch.select_config``) and NumPy are measured in
the same pinned worker, alternating round by round; every figure is the median of all its
samples. Each row also carries what the
run cost: distinct configs measured (the trial count a user asked for), rows recorded
(re-measurements included) and the wall time of the runs that recorded them. "of best" is the
fastest row's median over this row's: the issue's "within 10% of the long run's best" is >= 0.9.
"""
from __future__ import annotations

import datetime as dt
import os

from search_spaces import template_for
from search_spaces.space import Config
from tuner.dispatch import open_store, select_config
from workloads.errors import UsageError
from tuner.measure.measurer import MeasureOptions, Measurer
from tuner.measure.result import summarize
from tuner.target import host_target


def run_cost(store, workload, target, threads: int, template) -> dict:
    """Configs measured, trial rows and wall seconds of the runs that tuned ``workload``."""
    rows = store.trials(workload_key=workload.key, target_key=target.key, template=template.name,
                        template_version=template.version, threads=threads)
    run_ids = {r.run_id for r in rows if r.run_id}
    wall = 0.0
    for run in store.runs():
        if run.id in run_ids and run.finished_at is not None:
            wall += (run.finished_at - run.started_at).total_seconds()
    return {"configs": len({r.config_hash for r in rows}), "rows": len(rows),
            "runs": len(run_ids), "wall_s": round(wall, 1)}


def bench_compare(workload, dbs: list[str], threads: int, rounds: int = 3,
                  measure: MeasureOptions | None = None, log=print) -> dict:
    target = host_target()
    template = template_for(workload)
    load_before = os.getloadavg()[0]
    entries = []
    for url in dbs:
        store = open_store(url)
        # what a user of this database gets: the best, or the default it did not beat
        sel = select_config(workload, template, store, target, threads, quiet=True)
        best = sel.best
        if best is None:
            raise UsageError(f"{url} has no {template.name} v{template.version} record of {workload} "
                             f"on {target.key} with {threads} thread(s)")
        entries.append({"db": url, "config": dict(sel.config), "recorded_median_s": best.median,
                        "selected": "best" if sel.config == best.config else "default kept",
                        "best_config": dict(best.config),
                        **run_cost(store, workload, target, threads, template), "samples": []})
    numpy_samples: list[float] = []
    mopts = MeasureOptions(**{**(measure.__dict__ if measure else {}), "threads": threads})
    with Measurer(mopts) as m:
        for r in range(rounds):
            for e in entries:
                (res,) = m.measure(workload, template, [Config(e["config"])])
                if not res.ok:
                    raise UsageError(f"the best config of {e['db']} failed now: {res.status.value} {res.error}")
                e["samples"] += res.samples
            numpy_samples += m.baseline(workload).samples
            log(f"round {r + 1}/{rounds} done")
    n = summarize(numpy_samples)
    for e in entries:
        k = summarize(e["samples"])
        e.update(median_s=k["median"], iqr_s=k["iqr"], gflops=workload.flops() / k["median"] / 1e9,
                 ratio=n["median"] / k["median"])
    fastest = min(e["median_s"] for e in entries)
    for e in entries:
        e["of_best"] = fastest / e["median_s"]
    return {"kind": "bench-compare", "workload": workload.key, "threads": threads,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "target": target.to_dict(), "rounds": rounds,
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "numpy_median_s": n["median"],
            "numpy_iqr_s": n["iqr"], "entries": entries}


def compare_markdown(data: dict) -> str:
    lines = [f"bench compare: {data['workload']}, {data['threads']} thread(s), {data['rounds']} "
             f"alternating rounds, {data['date']}; NumPy {data['numpy_median_s'] * 1e3:.3f} ms; "
             f"load average before/after {data.get('load_average_1m')}", "",
             "| database | configs measured | tuning wall s | dispatched | median ms | GFLOPS | vs NumPy | of best |",
             "|---|---|---|---|---|---|---|---|"]
    for e in data["entries"]:
        lines.append(f"| {e['db']} | {e['configs']} | {e['wall_s']:.0f} | {e.get('selected', 'best')} | "
                     f"{e['median_s'] * 1e3:.3f} | {e['gflops']:.1f} | {e['ratio']:.2f} | {e['of_best']:.3f} |")
    return "\n".join(lines)
