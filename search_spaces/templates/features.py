"""Domain features for cost models, per template name.

A feature function maps (workload parameters, config, target caches) to named floats that
say what the knobs *mean* for this workload: effective tile sizes, working sets against L1
and L2, register-tile shape, arithmetic intensity, packing traffic, parallel grain. Knob
values alone cannot carry that across shapes (a 256-wide tile is "the whole matrix" for
256^3 and a cache block for 1024^3), so these features are what lets a model trained on one
workload rank configs of another (transfer).

Each template names its function in ``Template.domain_features``; templates without one have
no domain features (the cost model then uses the generic knob encoding only). Functions must accept configs with extra
knobs and tolerate missing optional ones (templates grow knobs).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

FeatureFn = Callable[[Mapping, Mapping, Mapping], dict]

DEFAULT_CACHES = {"L1d": 32 * 1024, "L2": 1024 * 1024, "L3": 32 * 1024 * 1024}
_BYTES = {"float32": 4, "float64": 8, "int32": 4}


def _log2(x: float) -> float:
    return math.log2(max(x, 1e-9))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gemm_features(params: Mapping, config: Mapping, caches: Mapping | None = None) -> dict:
    """GEMM (C[M,N] = A[M,K] @ B[K,N]) features of a blocked, register-tiled config."""
    caches = {**DEFAULT_CACHES, **(caches or {})}
    M, N, K = int(params["M"]), int(params["N"]), int(params["K"])
    b = _BYTES.get(params.get("dtype", "float32"), 4)
    lanes = 64 // b  # 512-bit registers
    c = config
    tm, tn, tk = min(c["tile_m"], M), min(c["tile_n"], N), min(c["tile_k"], K)
    mr, nr = min(c["mr"], tm), min(c["nr"], tn)
    mk = c.get("microkernel", "loops")
    vec = c.get("vec", lanes) if mk == "intrinsic" else lanes
    order = c.get("loop_order", "mnk")
    pack_a, pack_b = bool(c.get("pack_a", False)), bool(c.get("pack_b", False))
    threads = int(c.get("threads", 1))
    L1, L2, L3 = caches["L1d"], caches["L2"], caches["L3"]

    # Working sets of the loop nest levels.
    micro_ws = (mr * tk + tk * nr) * b + mr * nr * b          # A and B micro-panels + C tile
    a_block = tm * tk * b
    b_block = tk * tn * b
    c_block = tm * tn * b
    acc_regs = mr * _ceil_div(nr, vec)
    # Padding / edge waste: work done on padded rows/cols divided by useful work.
    pad_m = _ceil_div(M, tm) * tm / M if pack_a else _ceil_div(M, mr) * mr / M
    pad_n = _ceil_div(N, tn) * tn / N if pack_b else _ceil_div(N, nr) * nr / N
    edge_m = (tm % mr) != 0 or (M % tm) % mr != 0
    edge_n = (tn % nr) != 0 or (N % tn) % nr != 0
    # Packing traffic: how often each operand block is (re)packed, from the loop order.
    pos = {ax: order.index(ax) for ax in "mnk"}
    n_blocks = {"m": _ceil_div(M, tm), "n": _ceil_div(N, tn), "k": _ceil_div(K, tk)}
    a_repacks = n_blocks["n"] if pos["n"] < max(pos["m"], pos["k"]) else 1   # A block invariant in n
    b_repacks = n_blocks["m"] if pos["m"] < max(pos["n"], pos["k"]) else 1
    pack_bytes = (pack_a * M * K * a_repacks + pack_b * K * N * b_repacks) * b
    # Arithmetic intensity: FLOPs per byte moved at the register and cache-block levels.
    ai_micro = 2 * mr * nr / ((mr + nr) * b)
    ai_block = 2 * tm * tn * tk / ((tm * tk + tk * tn + tm * tn) * b)
    # Parallel grain: tasks of the prange loop and their balance over threads.
    par = c.get("parallel", "none")
    # parallel='k' (rowaxpy, M < 8) has one task per thread. rowaxpy itself has no column of
    # its own: two constant-zero columns for it moved the replay medians of the M >= 128
    # tables (1024^3: 20 -> 30.5 trials to 95%, 20 seeds), as the trees' random feature order
    # and subsamples change with the column count; its pinned knobs set its features instead.
    tasks = n_blocks.get(par, 1) if par in ("m", "n") else (threads if par == "k" else 1)
    balance = split_efficiency(tasks, 1, threads) if threads > 1 else 1.0
    flops = 2 * M * N * K
    return {
        "w_log_m": _log2(M), "w_log_n": _log2(N), "w_log_k": _log2(K), "w_log_flops": _log2(flops),
        "tile_m_eff": _log2(tm), "tile_n_eff": _log2(tn), "tile_k_eff": _log2(tk),
        "tile_m_frac": tm / M, "tile_n_frac": tn / N, "tile_k_frac": tk / K,
        "micro_ws_l1": _log2(micro_ws / L1), "micro_fits_l1": float(micro_ws <= L1),
        "a_block_l2": _log2(a_block / L2), "a_block_fits_l2": float(a_block <= L2),
        "b_block_l2": _log2(b_block / L2), "b_block_fits_l3": float(b_block <= L3),
        "c_block_l2": _log2(c_block / L2), "block_ws_l2": _log2((a_block + b_block + c_block) / L2),
        "acc_regs": float(acc_regs), "acc_regs_over": float(max(0, acc_regs - 28)),
        "nr_vectors": nr / vec, "nr_aligned": float(nr % vec == 0),
        "vec_lanes": float(vec), "mr_x_nr": _log2(mr * nr),
        "ai_micro": ai_micro, "ai_block": _log2(ai_block),
        "pad_waste": pad_m * pad_n, "edge_m": float(edge_m), "edge_n": float(edge_n),
        "pack_traffic": _log2(1 + pack_bytes / (flops / 2 * b / max(1, K))),
        "k_inner": float(order[-1] == "k"), "k_outer": float(order[0] == "k"),
        "n_blocks_k": _log2(n_blocks["k"]),
        "micro_calls": _log2(_ceil_div(M, mr) * _ceil_div(N, nr) * n_blocks["k"]),
        "par_tasks": _log2(tasks), "par_balance": balance, "threads": float(threads),
    }


def split_efficiency(dim: int, tile: int, threads: int) -> float:
    """Share of ``threads`` busy when ``dim`` is cut into ``tile`` blocks and ``prange``
    gives each thread a contiguous run of ceil(blocks / threads) of them: the ideal
    dim / threads over the slowest thread's rows."""
    per = _ceil_div(_ceil_div(dim, tile), threads)
    return dim / threads / min(dim, per * tile)


def feature_function(template_name: str) -> FeatureFn | None:
    """The domain feature function of the template registered as ``template_name`` (or of its
    family: 'gemm_v3' -> 'gemm'); None when it has none (``Template.domain_features``)."""
    from search_spaces import REGISTRY, get_template
    from search_spaces.template import Template

    for name in (template_name, template_name.split("_")[0].split("-")[0]):
        if name in REGISTRY:
            tpl = get_template(name)
            if type(tpl).domain_features is not Template.domain_features:
                return tpl.domain_features
            return None
    return None


def bind(template_name: str, params: Mapping, caches: Mapping | None = None):
    """``config -> features`` for one workload, or None when the template has none."""
    fn = feature_function(template_name)
    if fn is None:
        return None
    return lambda config: fn(params, config, caches)
