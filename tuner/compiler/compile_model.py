"""``build(graph) -> Module``: passes, one kernel per fused group, a memory plan, a warm-up.

For each fused group, in order:

1. a group that only reshapes (reshape/flatten/squeeze/expand_dims) becomes a *view* of its
   input's buffer: no kernel, no copy; a group that only concatenates along an axis whose
   slices are contiguous (channels at batch 1) is computed *in place*: each input's kernel
   writes straight into its slice of the output buffer (``inplace_concat``);
2. otherwise ``workloads.fused.workload_for_group`` gives its workload and
   ``search_spaces.templates_for(kind)[0]`` its template; the config is the best record for
   this target and thread count (``select_config``: "tuned"), or the announced fallback
   ("fallback"); ``fixed`` kernels (pools, softmax, LRN) have one config ("fixed");
   ``tuned=False`` uses every template's default (the untuned experiment);
   Kernels on the injective template's ``numpy`` formulation (NumPy array functions compiled
   by Numba) are counted as generated and also named in the summary line
   (``+N generated as NumPy array code``);
3. when the workload or the code cannot be made (an op no template generates) or the kernel
   does not compile, the group runs with the NumPy reference executor ("numpy") — counted in
   the summary and explained by ``--details``, never silent.

Kernels are generated to content-addressed files and compiled by Numba in parallel worker
processes (``jobs``; the same build workers the tuner uses, so a kernel a tuning run built is
not compiled again), then loaded in this process from Numba's on-disk cache. The memory plan
(``tuner.compiler.planner``) gives every intermediate value a slice of a reused buffer; every
kernel's argument tuple is bound once. A warm-up run at the end loads every kernel.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner import settings
from tuner.compiler.arena import place
from tuner.compiler.handoff import find_channel_slots, find_handoffs, runtime_overrides
from tuner.compiler.handoff import runtime_args as handoff_args
from tuner.compiler.module import Module, Step, Summary
from tuner.compiler.planner import plan_memory
from workloads.errors import NoRecordError, TunerError, UsageError
from tuner.dispatch import align_numba_cache
from workloads.graph.ir import Graph, Node

VIEW_OPS = frozenset({"reshape", "flatten", "squeeze", "expand_dims"})


@dataclass
class _Kernel:
    """What step 2 decided for one group before compiling."""

    node: Node
    kind: str
    source: str
    label: str
    workload: object | None = None
    template: object | None = None
    config: object | None = None
    path: Path | None = None
    note: str = ""
    prepared_only: bool = False   # the step calls kernel_prepared (its prepared operands are constants)


def _label(node: Node) -> str:
    from workloads.graph.fusion import describe

    try:
        return describe(node).summary()
    except TunerError:
        return node.body.name if node.body is not None else node.op


def pipeline(graph: Graph, opt_level: int | None = None, layout: str = "NHWC",
             prologue: bool = True) -> Graph:
    """The pass pipeline a build runs (task extraction runs the same one); ``opt_level``
    None: the default level for this graph (``default_opt_level``)."""
    from workloads.graph.passes import optimize

    opt_level = default_opt_level(graph, opt_level)

    kw = {} if prologue else {"prologue": False}
    if opt_level == 3:
        return optimize(graph, opt_level, layout=layout, **kw)
    return optimize(graph, opt_level, **kw)


def is_view(node: Node) -> bool:
    """A group that only reshapes its one input: no kernel, a view of the input."""
    body = node.body
    ops = [n for n in body.nodes if n.is_compute]
    return bool(ops) and len(body.inputs) == 1 and all(n.op in VIEW_OPS for n in ops)


def _concat_slots(node: Node, kinds: dict[str, str]) -> list[tuple[str, int]] | None:
    """(input value, element offset) for a group that is one ``concatenate`` whose inputs can
    all be written in place: contiguous slices, distinct inputs, each computed by a kernel or
    another in-place concat and not already placed elsewhere. None otherwise."""
    body = node.body
    ops = [n for n in body.nodes if n.is_compute]
    if len(ops) != 1 or ops[0].op != "concatenate":
        return None
    cat = ops[0]
    pidx = {p.name: k for k, p in enumerate(body.inputs)}
    if any(i not in pidx for i in cat.inputs):
        return None
    outer = [node.inputs[pidx[i]] for i in cat.inputs]
    shape = node.type.shape
    axis = cat.attrs["axis"] % len(shape)
    if int(np.prod(shape[:axis])) != 1 or len(set(outer)) != len(outer):
        return None
    if any(kinds.get(v) not in ("kernel", "concat") for v in outer):
        return None
    slots, off = [], 0
    for v, p in zip(outer, cat.inputs):
        slots.append((v, off))
        off += body.type_of(p).size
    return slots


def _plan_kernel(node: Node, *, threads: int, store, strict: bool, tuned: bool) -> _Kernel:
    from search_spaces import get_template, templates_for
    from search_spaces.template import kernel_source
    from tuner.dispatch import select_config
    from tuner.measure.measurer import write_source
    from workloads.fused import workload_for_group

    label = _label(node)
    try:
        w = workload_for_group(node)
    except Exception as exc:  # noqa: BLE001 - any failure here means "run it with NumPy"
        return _Kernel(node, "numpy", "numpy", label, note=f"no workload: {_one_line(exc)}")
    try:
        names = templates_for(w.kind)
        if not names:
            raise UsageError(f"no template for workload kind {w.kind!r}")
        tpl = names[0] if not isinstance(names[0], str) else get_template(names[0])
        if not tpl.tunable:
            config, source, note = tpl.default_config(w, threads), "fixed", ""
        elif tuned:
            sel = select_config(w, tpl, store, threads=threads, strict=strict, quiet=True)
            config, source, note = sel.config, sel.source, sel.note
        else:
            config, source, note = tpl.default_config(w, threads), "fallback", "untuned build"
        path = write_source(kernel_source(tpl, w, config), template=tpl)
    except NoRecordError:
        raise                                     # --strict: a fallback is an error
    except TunerError as exc:
        return _Kernel(node, w.kind, "numpy", label, w, note=f"no kernel: {_one_line(exc)}")
    except Exception as exc:  # noqa: BLE001 - a codegen bug: visible NumPy fallback
        return _Kernel(node, w.kind, "numpy", label, w, note=f"codegen failed: {_one_line(exc)}")
    return _Kernel(node, w.kind, source, label, w, tpl, config, path, note)


def _prepared_only(k: _Kernel, consts: set[str]) -> bool:
    """Whether the step will call ``kernel_prepared`` alone (``_bind_prepared``): the
    template prepares some operands and every one of them is a constant of the graph."""
    from search_spaces.template import prepared_inputs

    if k.path is None or k.template is None:
        return False
    idx = prepared_inputs(k.template, k.workload, k.config)
    return bool(idx) and all(k.node.inputs[i] in consts for i in idx)


def mark_prepared_only(g: Graph, kernels: dict) -> None:
    """Set each kernel's ``prepared_only`` from the graph's constants (before compiling: such
    a kernel compiles ``kernel_prepared`` alone)."""
    consts = {n.name for n in g.nodes if n.is_const}
    for k in kernels.values():
        k.prepared_only = _prepared_only(k, consts)


def _bind_prepared(k: _Kernel, fn, args: tuple, prepared: list, runtime: tuple):
    """(fn, args) of a kernel step: for a ``prepared_only`` kernel ``prepare`` runs once here
    and the step calls ``kernel_prepared`` on its result (appended to ``prepared``);
    otherwise (no prepared operands, or a weight given as a graph input) the entry, which
    prepares on every call."""
    if not k.prepared_only:
        return fn, args
    from search_spaces.template import prepare_kernel, prepared_inputs
    from tuner.measure.kernel_key import import_kernel_module

    pk = prepare_kernel(import_kernel_module(k.path),
                        prepared_inputs(k.template, k.workload, k.config), args[:-1], runtime)
    prepared.extend(pk.prepared)
    return pk.fn, pk.args(args[:-1], args[-1:])


def _place_prepared(steps: list[Step], prepared: list) -> None:
    """Move the prepared weights into one huge-page arena (``tuner.compiler.arena``) and
    point the steps' arguments at the copies: a run streams every weight once, and on 4 KiB
    pages each panel walks the page tables every 4 KiB (docs/models.md, "Weights on huge
    pages")."""
    arrays = [a for a in prepared if isinstance(a, np.ndarray)]
    if not arrays:
        return
    home = {id(a): c for a, c in zip(arrays, place(arrays))}
    for s in steps:
        if s.fn is not None:
            s.args = tuple(home.get(id(a), a) for a in s.args)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def _cached_stems(cache: Path) -> set[str]:
    """The kernel modules (file stems) with an index in Numba's cache under ``cache``: one
    walk of the folder (a recursive glob per kernel took a second of a warm ResNet-50 build)."""
    out = set()
    for _root, _dirs, files in os.walk(cache / "numba"):
        out.update(f.split(".", 1)[0] for f in files if f.endswith(".nbi"))
    return out


def _aliases(groups, kinds: dict, slots: dict) -> dict[str, str]:
    """Value -> the value whose buffer it is part of: views, and the inputs of flat in-place
    concatenations (``classify_groups``)."""
    alias = {n.name: n.inputs[0] for n in groups if kinds[n.name] == "view"}
    alias.update({v: c for v, (c, _) in slots.items()})
    return alias


def _planned_in_place(g: Graph, groups, kernels: dict, kinds: dict, alias: dict,
                      handoff: bool = True, inplace_concat: bool = True) -> set[str]:
    """The NHWC concatenations their producers will write in place, as planned: they need no
    kernel of their own, so none is compiled (a producer whose compile fails makes its
    concatenation copy after all; that kernel then compiles in the building process when
    first called)."""
    chans = _placements(groups, kernels, kinds, alias, set(g.outputs), handoff, inplace_concat)[1]
    return {s.concat for s in chans.values()}


def compiled_kernels(g: Graph, *, threads: int, store=None, tuned: bool = True) -> dict:
    """Group -> ``_Kernel`` for every kernel a build of the optimized graph ``g`` compiles
    (``prepared_only`` set as the build sets it): for the compile-time benchmarks."""
    groups, kernels, _views, kinds, slots = plan_groups(g, threads=threads, store=store, tuned=tuned)
    mark_prepared_only(g, kernels)
    skip = _planned_in_place(g, groups, kernels, kinds, _aliases(groups, kinds, slots))
    return {name: k for name, k in kernels.items() if name not in skip}


def _placements(groups, kernels: dict, kinds: dict, alias: dict, outputs: set, handoff: bool,
                inplace_concat: bool) -> tuple[dict, dict]:
    """(padded hand-offs, NHWC channel slots) of the planned kernels (``tuner.compiler.handoff``)."""
    handoffs = find_handoffs(groups, kernels, kinds, alias, outputs) if handoff else {}
    chans = (find_channel_slots(groups, kernels, kinds, alias, outputs, handoffs)
             if inplace_concat else {})
    return handoffs, chans


def build_request(k: _Kernel) -> dict:
    """The build worker's request compiling kernel ``k`` (``tuner.measure.worker.build``)."""
    from search_spaces.template import prepared_inputs

    return {"path": str(k.path), "entry": k.template.entry,
            "runtime_args": list(k.template.runtime_args(k.workload, k.config)),
            "arg_specs": k.workload.input_specs() + k.workload.output_specs(),
            "prepared": list(prepared_inputs(k.template, k.workload, k.config)),
            "n_inputs": len(k.workload.input_specs()), "prepared_only": k.prepared_only}


def compile_cost(path: Path) -> int:
    """A module's expected compile time, for ordering: longest first, so no worker is left
    with a long compile while the others idle at the end of the build. A parallel function
    (parfor lowering, its body compiled again as a gufunc) about doubles a module's compile,
    which otherwise grows with its generated source (docs/compile-once.md, "Cold builds")."""
    try:
        src = Path(path).read_text()
    except OSError:
        return 0
    return len(src) * (2 if "parallel=True" in src else 1)


def _compile_in_workers(kernels: list[_Kernel], jobs: int, threads: int, cache: Path) -> dict:
    """Compile every distinct uncached source in ``jobs`` worker processes; path -> reply."""
    from tuner.measure.pool import Worker, worker_env

    # Shape-generic modules are shared by layers: one compile per module and argument types.
    todo: dict[tuple, _Kernel] = {}
    cached = _cached_stems(cache)
    for k in kernels:
        if k.path is None:
            continue
        sig = (k.path, tuple((len(s), str(d)) for s, d in
                             k.workload.input_specs() + k.workload.output_specs()),
               k.prepared_only)
        if sig not in todo and k.path.stem not in cached:
            todo[sig] = k
    if not todo:
        return {}
    n = max(1, min(jobs, len(todo)))
    env = worker_env(threads, cache)
    log_dir = str(cache / "worker-logs")
    os.makedirs(log_dir, exist_ok=True)
    workers = [Worker(f"modelbuild{i}-{os.getpid()}", env, log_dir) for i in range(n)]
    pending = sorted(todo.items(), key=lambda item: -compile_cost(item[0][0]))
    replies: dict[Path, dict] = {}

    def loop(worker) -> None:
        while pending:
            try:
                (path, *_), k = pending.pop(0)
            except IndexError:
                return
            reply = worker.call("build", build_request(k), 600.0)
            if replies.get(path, {}).get("status", "OK") == "OK":
                replies[path] = reply

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(loop, workers))
    finally:
        for w in workers:
            w.kill()
    return replies


def plan_groups(g: Graph, *, threads: int, store, strict: bool = False, tuned: bool = True,
                inplace_concat: bool = True):
    """Step 2 for an optimized graph: which fused groups are views or in-place concatenations,
    and for every other one its workload, template and config (``_Kernel``), before anything
    compiles. Returns (groups, kernels by group, views, kind by group, concat slots); task
    extraction is tested against the workloads chosen here."""
    groups, views, kinds, slots = classify_groups(g, inplace_concat)
    kernels = {n.name: _plan_kernel(n, threads=threads, store=store, strict=strict, tuned=tuned)
               for n in groups if kinds[n.name] == "kernel"}
    return groups, kernels, views, kinds, slots


def classify_groups(g: Graph, inplace_concat: bool = True):
    """Which fused groups of an optimized graph get a kernel ("kernel"), are a view of their
    input ("view") or a concatenation computed in place by its inputs' kernels ("concat").
    Returns (groups, views, kind by group, concat input -> (concat, element offset))."""
    groups = [n for n in g.nodes if n.is_compute]
    stray = [n for n in groups if not n.is_fused]
    if stray:
        raise UsageError(f"build: %{stray[0].name} ({stray[0].op}) is not in a fused group")
    views: set[str] = set()
    kinds: dict[str, str] = {}
    slots: dict[str, tuple[str, int]] = {}
    for node in groups:
        cat = _concat_slots(node, kinds) if inplace_concat else None
        if is_view(node):
            views.add(node.name)
            kinds[node.name] = "view"
        elif cat is not None and not any(v in slots for v, _ in cat):
            slots.update({v: (node.name, off) for v, off in cat})
            views.add(node.name)
            kinds[node.name] = "concat"
        else:
            kinds[node.name] = "kernel"
    return groups, views, kinds, slots


def build(graph: Graph, *, opt_level: int | None = None, threads: int = 1, db: str | None = None,
          store=None, strict: bool = False, tuned: bool = True, jobs: int | None = None,
          layout: str = "NHWC", name: str | None = None, warmup: bool = True,
          inplace_concat: bool = True, int8=False, prologue: bool = True,
          handoff: bool = True) -> Module:
    """An executable module for ``graph`` (see the module docstring).

    ``opt_level``: the pass pipeline (0: no graph optimisation, one op per kernel; 2: NCHW;
    3: NHWC with direct convolutions; None: ``default_opt_level``, 3 for float models, 2
    for INT8 ones). ``threads``: the thread budget records are looked up for and kernels run with.
    ``db``/``store``: the records. ``strict``: a missing record is ``NoRecordError``.
    ``tuned=False``: template defaults everywhere. ``jobs``: compile processes (default:
    usable cores). ``inplace_concat=False`` copies every concatenation and ``prologue=False``
    keeps conv prologues out of their convs' groups and ``handoff=False`` has every padded
    direct conv copy its image (``tuner.compiler.handoff``) (all three for comparisons).
    ``int8``: True or a ``tuner.quant.flow.Int8Options``: calibrate, quantize (uint8
    activations, int8 weights) and build the quantized graph; ``module.summary.quant`` holds
    the coverage and ``module.quantized`` the quantization run (its graph is the reference).
    """
    from search_spaces.template import bind_runtime_args
    from tuner.dispatch import load_kernel, open_store
    from tuner.target import thread_count, usable_cores

    t_start = time.perf_counter()
    threads = thread_count(threads, "threads=")
    if layout not in ("NHWC", "NCHW"):
        raise UsageError(f"layout must be NHWC or NCHW, got {layout!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"jobs must be a positive integer (compile processes), got {jobs!r}")
    name = name or graph.name
    opt_level = default_opt_level(graph, opt_level, bool(int8))
    qrun = None
    if int8:
        from tuner.quant.flow import quantize_for_build

        qrun = quantize_for_build(graph, int8, db)
        graph = qrun.quantized.graph
    g = pipeline(graph, opt_level, layout, prologue)
    store = store if store is not None else (open_store(db) if tuned else None)
    cache = settings.cache_dir()
    align_numba_cache(cache)

    groups, kernels, views, kinds, slots = plan_groups(g, threads=threads, store=store,
                                                       strict=strict, tuned=tuned,
                                                       inplace_concat=inplace_concat)

    mark_prepared_only(g, kernels)
    types = {n.name: n.type for n in g.nodes}
    order = [(n.name, tuple(n.inputs)) for n in groups]
    alias = _aliases(groups, kinds, slots)
    in_place = _planned_in_place(g, groups, kernels, kinds, alias, handoff, inplace_concat)
    t_compile = time.perf_counter()
    replies = _compile_in_workers([k for name, k in kernels.items() if name not in in_place],
                                  jobs or usable_cores(), threads, cache)
    for k in kernels.values():
        r = replies.get(k.path) if k.path is not None else None
        if r is not None and r.get("status") != "OK":
            k.source, k.note = "numpy", f"compile failed ({r.get('status')}): " \
                                        f"{_one_line(Exception(r.get('error', '')))}"

    fns = {}   # group -> its compiled kernel (runtime arguments bound), loaded here

    def load(groups_to_load) -> None:
        for group in groups_to_load:
            k = kernels[group]
            if k.source != "numpy":
                try:
                    fns[group] = load_kernel(k.workload, k.template, k.config)
                except Exception as exc:  # noqa: BLE001 - visible NumPy fallback
                    k.source, k.note = "numpy", f"load failed: {_one_line(exc)}"
    load([group for group in kernels if group not in in_place])

    # Memory plan over the values the steps write; a padded hand-off's value has a buffer
    # of its own (its border stays zero). NHWC concatenations over channels whose producers
    # (as compiled) write their channels in place.
    handoffs, chans = _placements(groups, kernels, kinds, alias, set(g.outputs), handoff,
                                  inplace_concat)
    load(sorted(in_place - {s.concat for s in chans.values()}))   # copies after all
    views = views | {s.concat for s in chans.values()}
    for s in chans.values():
        kinds[s.concat] = "concat"
        kernels.pop(s.concat, None)
        alias[s.value] = s.concat
    overrides = runtime_overrides(handoffs, chans)
    planned = [n.name for n in groups if n.name not in alias]
    plan = plan_memory(order, {v: types[v].nbytes for v in planned},
                       {v: types[v].dtype for v in planned}, set(g.outputs), alias, own=set(handoffs))
    for v, h in handoffs.items():
        plan.add_own(v, int(np.prod(h.shape)) * np.dtype(types[v].dtype).itemsize, types[v].dtype)
    buffers = plan.allocate()
    arrays: dict[str, np.ndarray] = {}
    inputs: list[tuple[str, np.ndarray]] = []
    for n in g.nodes:
        if n.is_input:
            arrays[n.name] = np.empty(n.type.shape, n.type.dtype)
            inputs.append((n.name, arrays[n.name]))
        elif n.is_const:
            arrays[n.name] = np.array(n.value.array, copy=True, order="C")  # writable: one signature

    def array_of(v: str) -> np.ndarray:
        """The array of a value: a slice of its buffer, of its concat's, or a view."""
        a = arrays.get(v)
        if a is None:
            t = types[v]
            if v in slots:
                cat, off = slots[v]
                a = array_of(cat).reshape(-1)[off: off + t.size].reshape(t.shape)
            elif v in chans:   # its channels of an NHWC concatenation (strided)
                a = chans[v].view(array_of(chans[v].concat))
            elif v in alias:
                a = array_of(alias[v]).reshape(t.shape)
            else:   # its buffer (a hand-off's value: the padded image, border kept zero)
                shape = handoffs[v].shape if v in handoffs else t.shape
                a = buffers[plan.assign[v]][: int(np.prod(shape))].reshape(shape)
                a.fill(0)
            arrays[v] = a
        return a

    steps: list[Step] = []
    prepared: list = []   # the arrays kernel_prepared steps read (packed weights)
    for node in groups:
        if node.name in views:
            array_of(node.name)
            label = _label(node) + (" (in place)" if kinds[node.name] == "concat" else "")
            steps.append(Step(node.name, label, "view", "view", None))
            continue
        k = kernels[node.name]
        # a producer writes the whole array its output is placed in (``handoff``)
        held = array_of(chans[node.name].concat) if node.name in chans else array_of(node.name)
        args = tuple(array_of(i) for i in node.inputs) + (held,)
        fn = fns.get(node.name)   # none for a group left to NumPy
        if fn is None:
            fn = _numpy_step(node)
        else:
            if node.name in overrides:   # a padded hand-off's or a channel slot's placement
                runtime = handoff_args(k, overrides[node.name])
                fn = bind_runtime_args(fn.kernel, runtime)
            else:
                runtime = k.template.runtime_args(k.workload, k.config)
            fn, args = _bind_prepared(k, fn, args, prepared, runtime)
        steps.append(Step(node.name, k.label, k.kind, k.source, fn, args,
                          getattr(k.workload, "key", None),
                          getattr(k.template, "name", None),
                          dict(k.config) if k.config is not None else None, k.note,
                          tuple(b.name for b in node.body.nodes if b.is_compute)
                          if node.body is not None else (node.name,),
                          handoffs[node.name].view(array_of(node.name)) if node.name in handoffs
                          else array_of(node.name) if node.name in chans else None))

    _place_prepared(steps, prepared)
    if threads > 1 and any(s.source not in ("numpy", "view") for s in steps):
        for s in steps:
            if s.source == "numpy":
                s.fn = _serial_blas(s.fn)
    outputs = [array_of(o) for o in g.outputs]
    counts = {"tuned": 0, "fallback": 0, "fixed": 0, "numpy": 0}
    for s in steps:
        if s.source in counts:
            counts[s.source] += 1
    # Kernels whose formulation is NumPy array code compiled by Numba (the injective
    # template's ``numpy`` formulation) are generated, but named apart from loop kernels.
    array_code = sum(1 for s in steps if s.source != "numpy" and s.source != "view"
                     and (s.config or {}).get("formulation") == "numpy")
    summary = Summary(name, counts, len(views), plan.total_bytes, plan.naive_bytes, threads,
                      opt_level, 0.0, array_code=array_code, handoffs=len(handoffs))
    if qrun is not None:
        summary.quant = quant_summary(qrun, steps, groups)
    module = Module(name, inputs, steps, outputs, summary, threads)
    module.quantized = qrun
    if warmup:
        module.run([np.zeros(b.shape, b.dtype) for _, b in inputs], copy=False)
    summary.compile_seconds = time.perf_counter() - t_compile
    summary.build_seconds = time.perf_counter() - t_start
    return module


QUANT_OPS = frozenset({"quantize", "dequantize", "requantize", "qconv2d", "qdense", "qadd"})


def default_opt_level(graph: Graph, opt_level: int | None = None, int8: bool = False) -> int:
    """``opt_level``, or the default for ``graph`` (``settings.opt_level``): the INT8 level
    for a graph built with ``int8`` or already quantized (it has quantized ops)."""
    if opt_level is not None:
        return opt_level
    return settings.opt_level(None, int8 or any(n.op in QUANT_OPS for n in graph.nodes))


def is_quantized_group(node: Node) -> bool:
    """A fused group that computes on 8-bit values (a quantized op or a uint8/int8 tensor)."""
    return any(n.op in QUANT_OPS or (n.type is not None and n.type.dtype in ("uint8", "int8"))
               for n in node.body.nodes if n.is_compute)


def quant_summary(qrun, steps: list[Step], groups: list[Node]) -> dict:
    """Coverage of an int8 build: the Quantize pass's op counts and conversions, and how many
    kernels of quantized groups run generated code vs the NumPy reference."""
    cov = qrun.quantized.coverage.to_dict()
    qgroups = {n.name for n in groups if is_quantized_group(n)}
    qsteps = [s for s in steps if s.name in qgroups and s.source != "view"]
    cov["quantized_kernels"] = len(qsteps)
    cov["quantized_numpy"] = sum(1 for s in qsteps if s.source == "numpy")
    cov["reduce_range"] = qrun.quantized.reduce_range
    cov["calibration"] = qrun.calibration.samples
    cov["method"] = qrun.calibration.method
    cov["calibration_record"] = str(qrun.record)
    return cov


def _serial_blas(fn):
    """``fn`` with BLAS on one thread (``worker.serial_blas``): a NumPy step among
    multi-threaded generated kernels. After a multi-threaded call OpenBLAS's pool threads
    spin ~0.1 s before they sleep (docs/measurement.md), and the OpenMP threads of our
    kernels spin after theirs: on a 2-core machine the two pools take cores from each other.
    ResNet-50 at 2 threads with six convs as NumPy matmuls ran 153-185 ms with BLAS at 2
    threads, 52-61 ms at 1 (the NumPy steps themselves 20-26 vs 14-17 ms; all generated:
    41 ms; AMD Zen 4, 2026-12-06)."""
    from tuner.measure.worker import serial_blas

    def run(*args) -> None:
        with serial_blas():
            fn(*args)
    return run


def _numpy_step(node: Node):
    """Run a fused group with the NumPy reference executor, writing into the bound output."""
    from workloads.graph.executor import execute

    body = node.body

    def run(*args) -> None:
        np.copyto(args[-1], execute(body, list(args[:-1]))[0])
    return run
