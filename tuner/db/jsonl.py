"""Export and import of trials as JSON lines (one self-contained trial per line).

Import is all-or-nothing: every line is parsed and validated first; a malformed line (partial
JSON, missing or mistyped field, bad config or status) aborts with one message naming the
line, and nothing is written. Importing the same file twice adds nothing the second time.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import IO, Any

from sqlalchemy import select

from search_spaces.space import Config
from tuner.db.models import TargetRow, TrialRow
from tuner.db.store import Store
from workloads.errors import TunerError, UsageError
from tuner.measure.result import Status

FORMAT = "tuner-trial/1"

# field -> accepted types (None allowed where listed)
_FIELDS: dict[str, tuple] = {
    "workload": (str,), "workload_params": (dict,), "target": (dict,), "template": (str,),
    "template_version": (int,), "config": (dict,), "threads": (int,), "status": (str,),
    "error": (str,), "compile_time": (float, int, type(None)), "samples": (list,),
    "strategy": (str,), "versions": (dict,), "run_id": (str, type(None)), "created_at": (str,),
}
_TARGET_FIELDS = {"key": str, "cpu_name": str, "cores": int, "features": list}


def trial_to_dict(r: TrialRow) -> dict[str, Any]:
    t = r.target
    return {
        "format": FORMAT, "workload": r.workload.key, "workload_params": r.workload.params,
        "target": {"key": t.key, "cpu_name": t.cpu_name, "model_name": t.model_name,
                   "cores": t.cores, "features": t.features, "caches": t.caches},
        "template": r.template, "template_version": r.template_version,
        "config": json.loads(r.config), "threads": r.threads, "status": r.status, "error": r.error,
        "compile_time": r.compile_time, "samples": r.samples, "median": r.median, "iqr": r.iqr,
        "p95": r.p95, "gflops": r.gflops, "strategy": r.strategy, "versions": r.versions,
        "run_id": r.run_id, "created_at": r.created_at.isoformat(), "info": r.info,
    }


class RunLog:
    """Appends each recorded trial to a JSON-lines file (the export format, so it can be
    imported again). The database stays the source of truth: when the file cannot be written
    (disk full, read-only), one warning is printed, logging stops, and tuning goes on."""

    def __init__(self, path: str | None):
        self.path = path
        self.error: str | None = None

    def write(self, store: Store, ids: list[int]) -> None:
        if not self.path or self.error or not ids:
            return
        lines = "".join(json.dumps(trial_to_dict(r), sort_keys=True) + "\n"
                        for r in store.trials(ids=ids))
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write(lines)
        except OSError as exc:
            self.error = f"cannot write the trial log {self.path}: {exc.strerror or exc}"
            print(f"tuner: warning: {self.error}; logging stopped, every trial is still "
                  f"recorded in the database", file=sys.stderr)


def export_jsonl(store: Store, out: IO[str], **filters) -> int:
    n = 0
    for r in store.trials(**filters):
        out.write(json.dumps(trial_to_dict(r), sort_keys=True) + "\n")
        n += 1
    return n


def _validate(lineno: int, d: Any) -> dict:
    def bad(msg: str) -> UsageError:
        return UsageError(f"line {lineno}: {msg}; nothing was imported")

    if not isinstance(d, dict):
        raise bad("not a JSON object")
    for name, types in _FIELDS.items():
        if name not in d:
            raise bad(f"missing field {name!r}")
        v = d[name]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise bad(f"field {name!r} has type {type(v).__name__}")
    for name, typ in _TARGET_FIELDS.items():
        if not isinstance(d["target"].get(name), typ):
            raise bad(f"target field {name!r} missing or not {typ.__name__}")
    if d["status"] not in Status.__members__:
        raise bad(f"unknown status {d['status']!r}")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in d["samples"]):
        raise bad("samples must be positive numbers")
    if d["status"] == "OK" and not d["samples"]:
        raise bad("an OK trial needs samples")
    try:
        d["_config"] = Config(d["config"])
        import workloads

        d["_workload"] = workloads.from_key(d["workload"])
        d["_created"] = datetime.fromisoformat(d["created_at"])
    except (TunerError, ValueError, TypeError) as exc:
        raise bad(str(exc)) from None
    if d["_workload"].key != d["workload"]:
        raise bad(f"workload key {d['workload']!r} is not canonical")
    return d


def import_jsonl(store: Store, lines: IO[str]) -> tuple[int, int]:
    """Returns (imported, skipped as already present)."""
    parsed = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"line {lineno}: not valid JSON ({exc.msg}); nothing was imported") from None
        parsed.append(_validate(lineno, d))

    from tuner.measure.result import summarize

    imported = skipped = 0
    with store.session() as s:
        for d in parsed:
            t = d["target"]
            trow = s.scalar(select(TargetRow).where(TargetRow.key == t["key"]))
            if trow is None:
                trow = TargetRow(key=t["key"], cpu_name=t["cpu_name"], model_name=t.get("model_name", ""),
                                 cores=t["cores"], features=t["features"], caches=t.get("caches") or {})
                s.add(trow)
                s.flush()
            wrow = store._workload(s, d["_workload"])
            cfg = d["_config"]
            dup = s.scalar(select(TrialRow.id).where(
                TrialRow.workload_id == wrow.id, TrialRow.target_id == trow.id,
                TrialRow.template == d["template"], TrialRow.config_hash == cfg.hash,
                TrialRow.threads == d["threads"], TrialRow.created_at == d["_created"]))
            if dup is not None:
                skipped += 1
                continue
            st = summarize(d["samples"])
            flops = d["_workload"].flops()
            s.add(TrialRow(
                run_id=None, workload_id=wrow.id, target_id=trow.id, template=d["template"],
                template_version=d["template_version"], config=cfg.to_json(), config_hash=cfg.hash,
                threads=d["threads"], status=d["status"], error=d["error"],
                compile_time=d["compile_time"], samples=d["samples"], median=st["median"],
                iqr=st["iqr"], p95=st["p95"], mean=st["mean"],
                gflops=(flops / st["median"] / 1e9) if st["median"] else None,
                strategy=d["strategy"], versions=d["versions"],
                info={**(d.get("info") or {}), "imported_run_id": d["run_id"]},
                created_at=d["_created"]))
            imported += 1
    return imported, skipped
