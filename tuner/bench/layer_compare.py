"""``bench layers``: each kernel of a built model beside the ONNX Runtime nodes that compute the
same values, timed in the same process: where a model's gap to ORT sits, layer by layer.

Our side: ``Module.profile`` (each kernel timed alone, in order, median of ``repeat`` runs).
ORT's side: its own profiler (``SessionOptions.enable_profiling``) over ``warmup + repeat``
runs of a session on the same model and weights, each node's median ``kernel_time`` after the
warm-up. A node belongs to our fused group whose body computed (``Step.values``) the value
the node is named after (ORT names its NCHWc nodes ``<value>_nchwc``, fused ones
``fused <name>``) or one of
the node's outputs (read from ORT's optimized model): ORT's Conv + Add + Relu is named after
the conv's value, which our ``conv2d + [add -> relu]`` group holds in its body; a node keeping
its ONNX name (``n9``) is matched through that node's outputs. Nodes with no
group (ORT's layout reorders, ops we ran as views) are listed apart and counted in ORT's total.
Measured with it: docs/models.md, "Where ResNet-50's last percent sits".
"""
from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import time
from collections import defaultdict

import numpy as np


def _node_name(name: str) -> str:
    name = name[len("fused "):] if name.startswith("fused ") else name
    return name[:-len("_nchwc")] if name.endswith("_nchwc") else name


def ort_node_times(model_bytes: bytes, feed: dict, threads: int, *, warmup: int = 3,
                   repeat: int = 15) -> tuple[dict[str, float], dict[str, tuple[str, list[str]]]]:
    """({node: median seconds}, {node: (op type, outputs)}) of ORT's profiler on ``threads``."""
    import onnx

    from tuner.compiler.verify_model import ort_session

    with tempfile.TemporaryDirectory() as tmp:
        optimized_path = os.path.join(tmp, "optimized.onnx")
        sess = ort_session(model_bytes, threads, enable_profiling=True,
                           profile_file_prefix=os.path.join(tmp, "ort"),
                           optimized_model_filepath=optimized_path)
        for _ in range(warmup + repeat):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        optimized = onnx.load(optimized_path)
    per: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per[e["name"][:-len("_kernel_time")]].append(e["dur"] * 1e-6)
    times = {n: float(np.median(v[warmup:] if len(v) > warmup else v)) for n, v in per.items()}
    nodes = {n.name: (n.op_type, list(n.output)) for n in optimized.graph.node}
    return times, nodes


def compare_layers(path: str, threads_list: list[int], *, seed: int = 0, repeat: int = 15,
                   opt_level: int | None = None, tuned: bool = True, db: str | None = None,
                   shapes: dict | None = None, log=print) -> dict:
    from tuner.bench.hotspots import gemm_equivalent, gemm_label
    from tuner.bench.model_bench import SETTLE_SECONDS, model_versions
    from tuner.compiler.compile_model import build
    from tuner.compiler.verify_model import prepare
    from tuner.target import host_target
    from workloads.graph.executor import random_inputs

    model, graph = prepare(path, seed, shapes=shapes)   # shapes: its symbolic input dimensions
    inputs = random_inputs(graph, seed=1)
    feed = {p.name: x for p, x in zip(graph.inputs, inputs)}
    original = {n.name: list(n.output) for n in model.graph.node if n.name}   # ORT keeps these names
    rows: dict[str, dict] = {}
    unmatched: dict[str, dict] = {}
    totals = {}
    for t in threads_list:
        log(f"building {graph.name} ({t} thread(s)) and timing each kernel ...")
        m = build(graph, opt_level=opt_level, threads=t, db=db, tuned=tuned)
        m.run(inputs)
        owner: dict[str, str] = {}   # value -> the first step computing it
        for st in m.steps:
            for v in (st.name, *st.values):
                owner.setdefault(v, st.name)
        if t > 1:
            time.sleep(SETTLE_SECONDS)   # the build's and the last session's threads
        for step, sec in m.profile(inputs, repeat=repeat):
            r = rows.setdefault(step.name, {"name": step.name, "label": step.label,
                                            "kind": step.kind, "source": step.source,
                                            "gemm": None, "ours_ms": {}, "ort_ms": {}, "ort_nodes": []})
            if r["gemm"] is None and step.workload and step.kind in ("conv2d", "dense"):
                r["gemm"] = gemm_label(gemm_equivalent(step.workload))
            r["ours_ms"][str(t)] = sec * 1e3
        log(f"timing ONNX Runtime's nodes ({t} thread(s)) ...")
        if t > 1:
            time.sleep(SETTLE_SECONDS)   # our pool's threads spin-wait after its runs
        times, nodes = ort_node_times(model.SerializeToString(), feed, t, repeat=repeat)
        for node, sec in times.items():
            op, outs = nodes.get(node, ("?", []))
            base = _node_name(node)
            names = [base, *outs, *original.get(base, [])]
            group = next((owner[v] for v in names if v in owner), None)
            if group is None or group not in rows:
                u = unmatched.setdefault(node, {"node": node, "op": op, "ort_ms": {}})
                u["ort_ms"][str(t)] = sec * 1e3
                continue
            r = rows[group]
            r["ort_ms"][str(t)] = r["ort_ms"].get(str(t), 0.0) + sec * 1e3
            if node not in r["ort_nodes"]:
                r["ort_nodes"].append(node)
        totals[str(t)] = {"ours_ms": sum(r["ours_ms"].get(str(t), 0.0) for r in rows.values()),
                          "ort_ms": sum(times.values()) * 1e3,
                          "ort_unmatched_ms": sum(u["ort_ms"].get(str(t), 0.0) for u in unmatched.values())}
    target = host_target()
    return {"kind": "bench-layers", "model": path, "name": graph.name, "seed": seed,
            "repeat": repeat, "threads": threads_list, "target": target.key,
            "cpu": target.model_name, "versions": model_versions(),
            "time": dt.datetime.now().isoformat(timespec="seconds"), "rows": list(rows.values()),
            "ort_unmatched": list(unmatched.values()), "totals": totals}


def layers_markdown(data: dict, top: int = 20) -> str:
    """The ``top`` groups by our time minus ORT's at the first thread count, then the totals."""
    ts = [str(t) for t in data["threads"]]
    first = ts[0]

    def loss(r):
        return r["ours_ms"].get(first, 0.0) - r["ort_ms"].get(first, 0.0)

    head = "| kernel | group | GEMM | " + " | ".join(f"ours {t}t ms | ORT {t}t ms | ORT/ours {t}t" for t in ts) + " | ORT nodes |"
    lines = [head, "|" + "---|" * (4 + 3 * len(ts))]
    for r in sorted(data["rows"], key=loss, reverse=True)[:top]:
        cells = []
        for t in ts:
            o, a = r["ours_ms"].get(t), r["ort_ms"].get(t)
            cells += [f"{o:.3f}" if o is not None else "-", f"{a:.3f}" if a is not None else "-",
                      f"{a / o:.2f}" if o and a else "-"]
        lines.append(f"| {r['name']} | {r['label']} | {r['gemm'] or '-'} | " + " | ".join(cells)
                     + f" | {', '.join(r['ort_nodes']) or '-'} |")
    out = ["\n".join(lines), ""]
    for t in ts:
        tot = data["totals"][t]
        alone = ", ".join(sorted(u["node"] for u in data["ort_unmatched"] if t in u["ort_ms"])) or "none"
        ratio = tot["ort_ms"] / tot["ours_ms"] if tot["ours_ms"] else float("nan")
        out.append(f"{t} thread(s): our kernels {tot['ours_ms']:.2f} ms, ORT's nodes "
                   f"{tot['ort_ms']:.2f} ms ({tot['ort_unmatched_ms']:.2f} ms of them in nodes "
                   f"with no group of ours: {alone}); ORT/ours {ratio:.3f}")
    return "\n".join(out)
