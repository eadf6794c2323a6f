"""Knobs, constraints and repair of the blocked-GEMM engine, for every template built on it.

The gemm, dense and conv2d templates (and the int8 GEMM's tile lists) take from here:

- value lists: cache-block tiles (``block_values`` for the GEMM templates, ``tile_values`` for
  the dense/conv2d core: each list is kept as recorded tuning logs know it), micro-tile
  widths and vector lanes from the ISA (``nr_values``, ``vec_values``), ``pick``;
- constraints: the register budget (``isa.Isa.spill_reason``: accumulators, a row of B and an
  A broadcast in the vector register file), the vector width (``nr`` a multiple of ``vec``),
  the cache blocks against the micro-tile (``tiles_fit_micro``), threads against the parallel
  axis;
- ``repair``: the one rule making a hand-written config (a default, a ladder rung) valid;
- the dense/conv2d core's knob set and default (``core_knobs``, ``core_constraints``,
  ``default_core_config``, ``balanced_split``).

Templates keep what is theirs: their formulations, sources and the knobs only they have.
"""
from __future__ import annotations

import itertools
from typing import Mapping

from search_spaces import isa
from search_spaces.isa import Isa
from search_spaces.space import Config, ConfigSpace, Constraint, Knob
from workloads.errors import InstantiationError

LOOP_ORDERS = tuple("".join(p) for p in itertools.permutations("mnk"))
CORE_MR_VALUES = (4, 6, 7, 8)   # rows of the core's register tile (7: 7 x 7 outputs, conv2d)


# -- value lists ------------------------------------------------------------------------------
def tile_values(dim: int, start: int = 16) -> tuple[int, ...]:
    """Powers of two and 1.5x powers of two from ``start``, up to the first covering ``dim``
    (the dense/conv2d core's cache blocks)."""
    out: list[int] = []
    v = start
    while True:
        for t in (v, v * 3 // 2):
            if t not in out:
                out.append(t)
                if t >= dim:
                    return tuple(out)
        v *= 2


def block_values(dim: int, start: int) -> tuple[int, ...]:
    """``start``, then powers of two and 1.5x powers of two from 2*start, up to the first
    value covering ``dim`` (a tile that large means one block: the loop disappears); the
    GEMM templates' cache blocks."""
    out = [start]
    v = 2 * start
    while out[-1] < dim:
        out += [t for t in (v, v * 3 // 2) if t > out[-1]][: 1 if v >= dim else 2]
        v *= 2
    return tuple(out)


def split(dim: int, parts: int, micro: int = 16) -> int:
    """ceil(dim / parts) rounded up to a multiple of ``micro``: ``parts`` near-equal runs of
    whole ``micro``-wide tiles (196 rows, 2 parts: 112 in 16s, 102 in 6-row micro-tiles)."""
    return -(-(-(-dim // micro)) // parts) * micro


def with_splits(values: tuple[int, ...], dim: int, max_threads: int, micros: tuple[int, ...] = (16,),
                min_per_thread: int = 64) -> tuple[int, ...]:
    """Add the tiles that split ``dim`` evenly over 2..max_threads threads (rounded up to a
    multiple of each of ``micros``: 16 for the GEMM templates' blocks, the register tile's
    heights or widths for the dense/conv2d core's), so a parallel block loop can give every
    thread one equal block; only where each thread gets at least ``min_per_thread``."""
    extra = {split(dim, t, m) for m in micros for t in range(2, max_threads + 1)
             if dim >= min_per_thread * t}
    return tuple(sorted(set(values) | {v for v in extra if v < dim}))


def nr_values(lanes: int) -> tuple[int, ...]:
    """Register-tile widths of the vector micro-kernel: 1, 2 and 3 vectors of the ISA
    (AVX-512 fp32: 16, 32, 48; AVX2: 8, 16, 24)."""
    return (lanes, 2 * lanes, 3 * lanes)


def vec_values(lanes: int) -> tuple[int, ...]:
    """Vector lanes of the micro-kernel: half or whole register."""
    return (lanes // 2, lanes)


def pick(values, want: int, at_least: bool = False) -> int:
    """The value closest to ``want`` (ties: the smaller); with ``at_least`` the smallest value
    >= want (so a dimension splits into no more blocks than threads), else the largest."""
    if at_least:
        return min((v for v in values if v >= want), default=values[-1])
    return min(values, key=lambda v: (abs(v - want), v))


def pick_knob(space: ConfigSpace, knob: str, want: int, at_least: bool = False) -> int:
    """``pick`` among the values of a knob of ``space`` (tile lists depend on the workload)."""
    return pick(space.knob(knob).values, want, at_least)


def best_nr(n: int, choices=(16, 32, 48), threshold: float = 1.125) -> int:
    """The widest register tile whose zero padding of the N edge wastes at most ``threshold``."""
    def waste(nr):
        return -(-n // nr) * nr / n
    ok = [nr for nr in choices if waste(nr) <= threshold]
    return max(ok) if ok else min(choices, key=waste)


# -- constraints ------------------------------------------------------------------------------
def spill(target: Isa, mr: int, nr: int, vec: int) -> str | None:
    """The register budget of an MR x NR vector tile of ``vec`` lanes: accumulators, a row of
    B and an A broadcast must fit the ISA's vector registers (AVX-512: at most 28
    accumulators; AVX2: 12). A config that would spill is invalid before it is compiled."""
    return target.spill_reason(mr, -(-nr // vec))


def vector_width(c: Mapping) -> str | None:
    if c["nr"] % c["vec"]:
        return f"nr={c['nr']} is not a multiple of vec={c['vec']}"
    return None


def tiles_fit_micro(M: int, N: int, multiple: bool) -> Constraint:
    """Cache blocks against the micro-tile (a block covering its dimension is always fine).
    ``multiple``: every block a whole number of micro-tiles (the core's spaces); else at least
    one micro-tile (the GEMM template's space, which recorded tuning logs hold: a block that is
    not a multiple pads its last panel)."""
    def check(c):
        for knob, micro, dim in (("tile_m", "mr", M), ("tile_n", "nr", N)):
            t, m = c[knob], c[micro]
            if t >= dim:
                continue
            if multiple and t % m:
                return f"{knob}={t} is not a multiple of {micro}={m}"
            if not multiple and t < m:
                return f"{knob}={t} is smaller than {micro}={m}"
        return None
    return Constraint("tiles_fit_micro", check)


def threads_match_parallel() -> Constraint:
    def check(c):
        if (c["threads"] > 1) != (c["parallel"] != "none"):
            return "threads > 1 exactly when parallel != 'none'"
        return None
    return Constraint("threads", check)


# -- repair -----------------------------------------------------------------------------------
def repair(space: ConfigSpace, cfg: Mapping) -> Config:
    """Make a hand-written config (a default, a ladder rung) valid, the one rule for every
    template on the engine:

    - a cache block that does not fit the micro-tile moves to the nearest value (ties: the
      smaller) that is a whole number of micro-tiles or covers its dimension. A block that
      is not a multiple of the micro-tile pads its last panel in every block, not only at
      the matrix edge (tile_n = 256 with a 48-wide tile computes 288 columns per block,
      12.5% of the FLOPs wasted), so the multiple is taken even where a space allows any
      block at least one micro-tile large (the GEMM template's);
    - a micro-tile that spills or whose width is not whole vectors: first ``vec`` becomes the
      widest lane count dividing ``nr``, then ``mr`` shrinks to the next smaller value.
    """
    cfg = dict(cfg)
    for _ in range(64):
        reason = space.violation(cfg)
        if reason is None:
            return Config(cfg)
        if reason.startswith("tiles_fit_micro"):
            for knob, micro in (("tile_m", "mr"), ("tile_n", "nr")):
                vals = space.knob(knob).values
                ok = [v for v in vals if v % cfg[micro] == 0 or v == vals[-1]]
                if cfg[knob] not in ok:
                    cfg[knob] = min(ok, key=lambda v: (abs(v - cfg[knob]), v))
        elif reason.startswith(("micro_tile", "registers", "vector_width")):
            vecs = [v for v in space.knob("vec").values if cfg["nr"] % v == 0]
            smaller = [v for v in space.knob("mr").values if v < cfg["mr"]]
            if cfg["nr"] % cfg["vec"] and vecs:
                cfg["vec"] = vecs[-1]
            elif smaller:
                cfg["mr"] = smaller[-1]
            else:
                raise InstantiationError(f"cannot repair config {cfg}: {reason}")
        else:
            raise InstantiationError(f"cannot repair config {cfg}: {reason}")
    raise InstantiationError(f"cannot repair config {cfg}")


# -- the dense/conv2d core's knobs and default --------------------------------------------------
def core_knobs(M: int, N: int, K: int, max_threads: int, pack_a: tuple, pack_b: tuple,
               dtype: str = "float32", target: Isa | None = None) -> list[Knob]:
    """The core's knobs; micro-tile widths and vector lanes are the ISA's (``target``,
    default the one generated for): nr 1-3 vectors, vec a half or a whole register."""
    L = (target or isa.current()).lanes(dtype)
    # the blocks of an even split too: 196 rows in 6-row tiles on 2 threads, 102 (102 + 94)
    return [
        Knob("tile_m", with_splits(tile_values(M), M, max_threads, CORE_MR_VALUES, 1), True,
             "rows of C per cache block"),
        Knob("tile_n", with_splits(tile_values(N), N, max_threads, nr_values(L), 1), True,
             "columns of C per cache block"),
        Knob("tile_k", tile_values(K), True, "K depth per cache block"),
        Knob("mr", CORE_MR_VALUES, True, "rows of the register micro-tile"),
        Knob("nr", nr_values(L), True, "columns of the register micro-tile"),
        Knob("vec", vec_values(L), True, "vector lanes (half or whole register)"),
        Knob("loop_order", LOOP_ORDERS, False, "order of the block loops, outermost first"),
        Knob("pack_a", pack_a, False, "copy A blocks into MR-row panels"),
        Knob("pack_b", pack_b, False, "copy B blocks into NR-column panels"),
        Knob("parallel", ("none", "m", "n"), False, "block loop run with numba.prange"),
        Knob("threads", tuple(range(1, max(1, max_threads) + 1)), True, "Numba threads"),
    ]


def core_constraints(M: int, N: int, target: Isa | None = None) -> list[Constraint]:
    target = target or isa.current()

    def micro(c):
        return vector_width(c) or spill(target, c["mr"], c["nr"], c["vec"])

    return [Constraint("micro_tile", micro), tiles_fit_micro(M, N, multiple=True),
            threads_match_parallel()]


def default_core_config(space: ConfigSpace, M: int, N: int, K: int, max_threads: int,
                        pack_a: bool, pack_b: bool, nr: int | None = None,
                        mr: int | None = None, a_bytes: int | None = None,
                        direct_conv: bool = False) -> Config:
    """Whole-register vectors, the widest tile that pads N little, 6 rows up to two vectors
    (AVX2 fp32: 6 x 16 = 15 of 16 ymm; AVX-512: 6 x 32 = 15 of 32 zmm), 4 rows at three.
    ``a_bytes``: A's bytes (the activation), which a split over N has every thread read whole;
    ``direct_conv``: A is an image read in place through windows (``balanced_split``)."""
    nrs = space.knob("nr").values
    vec = space.knob("vec").values[-1]
    nr = nr or best_nr(N, nrs)
    mr = mr or (6 if nr <= 2 * vec else 4)
    # the default blocks come from the regular ladder; the even-split values are for the split
    cfg = {"tile_m": pick(tile_values(M), 96),
           "tile_n": pick(tile_values(N), 256 if nr != nrs[-1] else 288),
           "tile_k": pick(space.knob("tile_k").values, K if K <= 1024 else 512),
           "mr": mr, "nr": nr, "vec": vec, "loop_order": "nkm",
           "pack_a": pack_a, "pack_b": pack_b,
           "parallel": "none", "threads": 1}
    if max_threads > 1:
        cfg["parallel"], cfg["threads"] = ("n" if N >= 2 * cfg["tile_n"] else "m"), max_threads
        cfg = balanced_split(space, repair(space, cfg), M, N,
                             shared_a=(K, a_bytes) if a_bytes else None, direct_conv=direct_conv)
    return repair(space, cfg)


# FMA work (flops) a thread gives up, per byte of the activation it reads beyond its share
# (``balanced_split``); fitted on ResNet-50 and DenseNet-121 at 2 threads (Intel Xeon): 16 and
# 8 also moved 3 x 3 layers with 400 KB images to M, 2-6% slower each
FLOPS_PER_SHARED_BYTE = 4
# int8 operations a thread gives up per byte of A it packs beyond its share: a quantized
# conv's anchor packs (im2col) all of A on every thread split over N. Estimated on Zen 3 at 2
# threads (ResNet-50 INT8, 2026-12-04): M3136 N64 K576 split over N 1.42 ms, over M 1.09 ms,
# ~0.37 ns per extra byte at ~115 GOPS = ~42 operations; the M/N choices of all 20 largest
# layers measured there agree for any value from 6 to 73
INT8_PACK_OPS_PER_BYTE = 40
# a direct conv whose M split keeps both threads this busy takes M over N where their costs
# are within the slack (``balanced_split``, ``direct_conv``)
EVEN_M = 0.98


def balanced_split(space: ConfigSpace, cfg: Mapping, M: int, N: int, slack: float = 0.03,
                   shared_a: tuple[int, int] | None = None,
                   per_shared_byte: float | None = None, direct_conv: bool = False) -> dict:
    """The parallel axis and its cache block that keep every thread busy: among the tile
    values of the m and n axes (multiples of the micro tile, at most one thread's share or
    the default block, and never twice the default), the best ``split_efficiency``, then,
    within ``slack`` of it, the default axis and the largest block (smaller blocks cost
    packing and loop overhead).

    ResNet-50's NCHW convs at 2 threads with the old rule (n when N >= 2 blocks, else m,
    blocks of 96 rows): M = 256 in 3 blocks (one thread does two: 67% busy), M = 512 or 1024
    in 6 or 11 (89%); weighted by MACs 80% busy, the bound of the 1.53x two-thread scaling
    measured on AVX-512. With 128-row blocks those layers split evenly.

    ``shared_a`` = (K, A bytes): the axis is chosen first by cost, its thread's flops over its
    split efficiency plus, split over N, ``FLOPS_PER_SHARED_BYTE`` per byte of A it reads
    beyond its share (every thread reads all of A; in a model A is the activation the step
    before just wrote, half of it in the other core's cache). Split over M every thread
    reads all of B too, but that is the weights, fetched from memory once and shared through
    the last-level cache: charging B as well moved Inception v1's M = 169 layers to N, 5-9%
    slower each. ``per_shared_byte`` replaces ``FLOPS_PER_SHARED_BYTE`` where a thread does
    more with A than read it (the int8 anchors pack all of it: ``INT8_PACK_OPS_PER_BYTE``).
    Within ``slack`` the default axis stays; then the block as above. Measured
    (Intel Xeon, 2 threads, in the model, one process): ResNet-50's 28 x 28 x 512 -> 128 1 x 1
    split over N (2 blocks, 100% even, each thread reading the 1.6 MB image) 0.48-0.49 ms,
    over M (33 blocks, 97%) 0.37; the models 1.005-1.025x (DenseNet-121 1.025x).

    The candidates include the even splits (``with_splits`` in the core's lists: 196 rows in 6-row tiles,
    2 threads: a 102-row block, 102 and 94 rows, where the ladder's 96 gave one thread 192
    and 24 gave it 120). Measured at 2 threads, in the model, one process, alternating
    (Intel Xeon, 2026-12-03): Inception v2 1.046x (16 of its 39 conv layers moved, most
    from 16- or 24-row blocks or an N split to one block per thread), DenseNet-121 1.015x,
    ResNet-50 1.006x, Inception v1 and SqueezeNet (M = 169: 90 or 88 rows for 96) 1.00x; as
    AVX2 code (``TUNER_CPU=haswell``) Inception v2 1.014x, DenseNet-121 1.019x.

    ``direct_conv`` (A an image read in place): one block per thread (the even split) is a
    candidate even above twice the default block (the cap stays for the formulations that pack
    an A block per cache block; not measured there). A direct convolution reads A (the image)
    in place, so a long block of pixels packs nothing more, and the even split is often the
    only one near 100%: 28 x 28 = 784 rows in 6-row tiles split 96% busy in 24-row blocks (17
    to one thread, 16 to the other), 99% in two of 396. AMD Zen 4, 2 threads, 2026-12-07:
    `bench tiles --rows 784` 1.03-1.04x on ResNet-50's M-split 784-row layers, `--rows 3136`
    0.99-1.05x, the stem 1.02x; the models, both builds in one process, both build orders,
    12-16 rounds each: ResNet-50 1.008 / 1.010x, DenseNet-121 1.008 / 1.021x, Inception v1
    1.013 / 1.014x, Inception v2 1.009 / 1.012x, SqueezeNet 1.014 / 1.012x, ZFNet-512 1.003 /
    1.004x, VGG-19 1.001 / 1.009x (docs/models.md, "One block per thread").

    Where the costs of the two axes are within ``slack`` and M splits at least ``EVEN_M``
    evenly, such a conv takes M: split over N every thread reads the whole image and writes
    half of every output row (and of the residual's). ResNet-50's 28 x 28 1 x 1 expansions
    with a residual (M784 N512 K128, 4 layers), over N in two 256-channel blocks before:
    `bench tiles` 1.25x over M in two 396-row blocks; the model at 2 threads, both builds in
    one process, both orders, 12 rounds each: 1.015 / 1.009x (24 of 24 rounds faster). The
    long-K layers it also moves (VGG-19's M784 N512 K2304/4608, ZFNet-512's M144 N512
    K2304/4608) measure 1.00x in `bench tiles`; VGG-19 1.007 / 1.006x, ZFNet-512 0.991 /
    1.007x in the model."""
    from search_spaces.templates.features import split_efficiency

    cfg = dict(cfg)
    T = int(cfg["threads"])
    if T < 2 or cfg["parallel"] == "none":
        return cfg
    cands = []
    for axis, dim, knob, micro in (("m", M, "tile_m", "mr"), ("n", N, "tile_n", "nr")):
        values = space.knob(knob).values
        share = min((v for v in values if v * T >= dim and (v % cfg[micro] == 0 or v >= dim)),
                    default=values[-1])
        cap = min(max(cfg[knob], share), 2 * cfg[knob])
        for t in values:
            if (t <= cap or (direct_conv and t == share)) and (t % cfg[micro] == 0 or t >= dim):
                cands.append((split_efficiency(dim, t, T), axis == cfg["parallel"], t, axis, knob))
    if not cands:
        return cfg
    if shared_a is not None:   # the axis first, by cost; then its block, as below
        K, a_bytes = shared_a
        work = 2.0 * M * N * K / T
        per_byte = FLOPS_PER_SHARED_BYTE if per_shared_byte is None else per_shared_byte

        def cost(c) -> float:
            extra = a_bytes * (T - 1) / T if c[3] == "n" else 0.0
            return work / max(c[0], 1e-9) + per_byte * extra
        by_axis = {a: min(cost(c) for c in cands if c[3] == a) for a in {c[3] for c in cands}}
        low = min(by_axis.values())
        # within slack the default axis, or M where a direct conv's M splits (almost) evenly
        even_m = direct_conv and max((c[0] for c in cands if c[3] == "m"), default=0) >= EVEN_M
        axis = max((a for a, v in by_axis.items() if v <= low * (1 + slack)),
                   key=lambda a: (a == ("m" if even_m else cfg["parallel"]), -by_axis[a]))
    top = max(c[0] for c in cands)
    near = [c for c in cands if c[0] * (1 + slack) >= top]
    if shared_a is not None:
        mine = [c for c in cands if c[3] == axis]
        near = [c for c in near if c[3] == axis] or [max(mine, key=lambda c: (c[0], c[2]))]
    _, _, t, axis, knob = max(near, key=lambda c: (c[1], c[2]))
    cfg["parallel"], cfg[knob] = axis, t
    return cfg
