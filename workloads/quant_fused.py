"""Workloads for quantized fused groups: a ``qdense`` or ``qconv2d`` anchor (uint8 data x int8
weight -> int32) with its integer epilogue, computed by the int8 templates.

Kinds (registered in ``workloads.REGISTRY``, claimed before ``fixed``):

- ``qdense``: ``qdense`` (data[..., K] x weight[N, K]^T);
- ``qconv2d``: ``qconv2d`` with ``groups=1`` in NCHW/OIHW or NHWC/HWIO;
- ``qconv2d_grouped``: a grouped (depthwise too) ``qconv2d``, NCHW/OIHW, batch 1: ``groups``
  GEMMs, one per group of C/groups input and O/groups output channels (its ``geometry`` is
  one group's convolution and GEMM, with ``groups``);
- ``qdepthwise_conv2d``: a depthwise ``qconv2d`` (groups == input channels), NCHW/OIHW, batch
  1 (a direct kernel: as GEMMs, one per channel, its groups are slivers).

Epilogue claimed (what the Quantize pass and FuseOps make): nothing (int32 output), or a
``requantize`` along the output-channel axis (to uint8/int8, or float32), then any number of
``qadd`` with an operand of the output's shape (a fused residual add), then optionally a
``dequantize`` (FP32 ops read the result). Anything else stays a
``fixed`` group (the NumPy reference runs it, counted by the build).

Both are GEMMs C[M, N] = A[M, K] @ B[K, N] with M rows of data (output pixels for a conv), N
output channels and K the reduction; the weight range ``w_max`` (the op's attribute: 64 for
7-bit ``reduce_range`` weights) is part of the workload, so the kernels may use AVX2's
saturating ``vpmaddubsw`` exactly when it cannot saturate. The check is exact for every output
dtype: the kernel computes the reference's integer and float32 operations in the same order.
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import ClassVar

import numpy as np

from workloads.errors import UsageError
from workloads.fused import FusedWorkload
from workloads.workload import first_difference

EPILOGUE_OPS = ("requantize", "qadd", "dequantize")
OUT_DTYPES = ("uint8", "int8", "float32", "int32")
CONV_LAYOUTS = (("NCHW", "OIHW"), ("NHWC", "HWIO"))


def _channel_axis(params: dict) -> int:
    rank = len(params["output"][0])
    if params["anchor"] == "qconv2d":
        return params["anchor_attrs"]["data_layout"].index("C")
    return rank - 1


def epilogue_ok(params: dict) -> bool:
    """requantize (channel axis) first, then qadds of an output-shaped operand; or nothing."""
    epi = params["epilogue"]
    out_shape, out_dtype = params["output"]
    if out_dtype not in OUT_DTYPES:
        return False
    if not epi:
        return out_dtype == "int32"
    first = epi[0]
    if first["op"] != "requantize" or first["operand"] != 0:
        return False
    rank = len(out_shape)
    if first["attrs"]["axis"] % rank != _channel_axis(params):
        return False
    if first["attrs"]["dtype"] == "float32" and len(epi) > 1:
        return False
    for n, e in enumerate(epi[1:], 1):
        if e["op"] == "dequantize" and n == len(epi) - 1 and not e["others"] and e["operand"] == 0:
            continue
        if e["op"] != "qadd" or len(e["others"]) != 1 or e["operand"] not in (0, 1):
            return False
        _k, shape, dtype = e["others"][0]
        if list(shape) != list(out_shape) or dtype != e["attrs"]["dtype"]:
            return False
    return all(e["op"] in EPILOGUE_OPS for e in epi)


class QuantGemmGroup(FusedWorkload):
    """Common part of the quantized anchors: the GEMM view, inputs, the exact check."""

    anchor_op: ClassVar[str] = ""
    nominal_flops_rate: ClassVar[float] = 40e9

    @classmethod
    def claims_group(cls, params: dict) -> bool:
        return params["anchor"] == cls.anchor_op and epilogue_ok(params) and cls._claims(params)

    @classmethod
    def _claims(cls, params: dict) -> bool:
        return True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.claims_group(self.p):
            raise UsageError(f"{self.kind} workload: the group {self.summary()} is not one this kind computes")
        self.geometry  # noqa: B018

    @property
    def w_max(self) -> int:
        return int(self.attrs.get("w_max", 128))

    @property
    def x_zero_point(self) -> int:
        return int(self.attrs.get("x_zero_point", 0))

    @property
    def gemm_dtype(self) -> str:
        """The int8 GEMM workload dtype whose promise the weights keep (``workloads.gemm``)."""
        return "int8w7" if self.w_max <= 64 else "int8"

    def gemm(self):
        """The GEMM this group computes, as the int8 ``Gemm`` workload (M, N, K, weight range)."""
        from workloads.gemm import Gemm

        g = self.geometry
        return Gemm(g["M"], g["N"], g["K"], self.gemm_dtype)

    def reduction_length(self) -> int:
        return self.geometry["K"]

    @property
    def out_channels(self) -> int:
        """Output channels of the whole op (all groups)."""
        return self.geometry["N"] * self.geometry.get("groups", 1)

    def flops(self) -> int:
        g = self.geometry
        return (2 * g["M"] * g["N"] * g["K"] * g.get("groups", 1)
                + 2 * math.prod(self.out_shape) * len(self.epilogue))

    # -- inputs and check ---------------------------------------------------------------
    def make_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """uint8 data over 0..255 (row 0 all 255), int8 weights over the promised range (one
        output channel all +w_max, one all -w_max: the worst case for ``vpmaddubsw``), int32
        biases, and requantize scales that map the accumulators onto about 1.5 x the output
        range (so some values clamp); qadd operands uniform."""
        rng = np.random.default_rng(seed)
        specs = self.input_specs()
        x_i, w_i = self.p["anchor_inputs"]
        arrays: list[np.ndarray | None] = [None] * len(specs)
        xs, _ = specs[x_i]
        x = rng.integers(0, 256, size=xs, dtype=np.int32).astype(np.uint8)
        x.reshape(-1)[: self.geometry["K"]] = 255   # a row of the largest level
        hi = min(self.w_max, 127)
        ws, _ = specs[w_i]
        w = rng.integers(-hi, hi + 1, size=ws, dtype=np.int32).astype(np.int8)
        ax = self.weight_out_axis()
        first = [slice(None)] * w.ndim
        last = [slice(None)] * w.ndim
        first[ax], last[ax] = 0, w.shape[ax] - 1
        w[tuple(first)] = hi
        if w.shape[ax] > 1:
            w[tuple(last)] = -self.w_max
        arrays[x_i], arrays[w_i] = x, w
        from workloads.graph.ir import Attrs
        from workloads.graph.ops import get_op

        op = get_op(self.anchor)
        acc = np.asarray(op.compute([x, w], Attrs(op.make_attrs(self.attrs)))).astype(np.int64)
        epi = self.epilogue
        if epi:
            rq = epi[0]
            (kb, bshape, _), (ks, sshape, _) = rq["others"]
            c = self.out_channels
            bias = rng.integers(-(1 << 12), 1 << 12, size=bshape, dtype=np.int64).astype(np.int32)
            axis = _channel_axis(self.p)
            moved = np.moveaxis(acc, axis, -1).reshape(-1, c) + bias.astype(np.int64).reshape(1, -1)
            peak = np.maximum(np.abs(moved).max(axis=0), 1).astype(np.float64)
            levels = 1.5 * (255 if rq["attrs"]["dtype"] != "float32" else 1.0)
            scale = (levels / peak * rng.uniform(0.5, 1.0, size=c))
            if sshape[0] == 1:
                scale = scale[:1]
                peak_all = float(np.abs(moved).max()) or 1.0
                scale[:] = levels / peak_all
            arrays[kb], arrays[ks] = bias, scale.astype(np.float32)
            for e in epi[1:]:
                if e["op"] != "qadd":
                    continue
                (k, shape, dtype), = e["others"]
                arrays[k] = rng.integers(0, 256, size=shape, dtype=np.int32).astype(dtype) \
                    if dtype == "uint8" else rng.integers(-128, 128, size=shape, dtype=np.int32).astype(dtype)
        for i, a in enumerate(arrays):
            if a is None:
                raise UsageError(f"{self.kind}: no generated input for parameter {i}")
        return arrays  # type: ignore[return-value]

    def weight_out_axis(self) -> int:
        return 0

    def check(self, inputs, outputs, expected):
        """Exact for every dtype: integers element by element, float32 bit for bit (the kernel
        computes ``float32(acc + bias) * scale`` as the reference does)."""
        (c,), (ref,) = outputs, expected
        if c.shape != ref.shape:
            return f"output shape {c.shape} != expected {ref.shape}"
        if ref.dtype.kind == "f":
            bad = ~((c == ref) | (np.isnan(c) & np.isnan(ref)))
        else:
            bad = c.astype(np.int64) != ref.astype(np.int64)
        return first_difference(c, ref, bad)


class QDenseGroup(QuantGemmGroup):
    kind: ClassVar[str] = "qdense"
    anchor_op: ClassVar[str] = "qdense"

    @classmethod
    def _claims(cls, params: dict) -> bool:
        xs, ws = (params["inputs"][i][0] for i in params["anchor_inputs"])
        return len(ws) == 2 and len(xs) >= 1

    @cached_property
    def geometry(self) -> dict:
        (xs, _), (ws, _) = (self.p["inputs"][i] for i in self.p["anchor_inputs"])
        return {"M": math.prod(xs[:-1]), "N": ws[0], "K": ws[1], "weight": "NK"}


class QConv2dGroup(QuantGemmGroup):
    kind: ClassVar[str] = "qconv2d"
    anchor_op: ClassVar[str] = "qconv2d"

    @classmethod
    def _claims(cls, params: dict) -> bool:
        a = params["anchor_attrs"]
        return a.get("groups", 1) == 1 and (a["data_layout"], a["kernel_layout"]) in CONV_LAYOUTS

    def weight_out_axis(self) -> int:
        return self.attrs["kernel_layout"].index("O")

    @cached_property
    def geometry(self) -> dict:
        """The convolution (N, C, H, W, O, KH, KW, OH, OW, strides, padding, dilation,
        layouts) and its GEMM view: M = N*OH*OW output pixels, N (GEMM) = O, K = C*KH*KW.
        For ``groups`` > 1, C and O are one group's channels (each group one such GEMM)."""
        a = self.attrs
        groups = a.get("groups", 1)
        dl, kl = a["data_layout"], a["kernel_layout"]
        (xs, _), (ws, _) = (self.p["inputs"][i] for i in self.p["anchor_inputs"])
        x = {ch: xs[dl.index(ch)] for ch in "NCHW"}
        k = {ch: ws[kl.index(ch)] for ch in "OIHW"}
        o = dict(zip(dl, self.out_shape))
        conv = {"batch": x["N"], "C": x["C"] // groups, "H": x["H"], "W": x["W"], "O": k["O"] // groups,
                "KH": k["H"], "KW": k["W"], "OH": o["H"], "OW": o["W"],
                "SH": a["strides"][0], "SW": a["strides"][1],
                "PT": a["padding"][0], "PL": a["padding"][1],
                "DH": a["dilation"][0], "DW": a["dilation"][1],
                "data_layout": dl, "kernel_layout": kl, "groups": groups}
        conv.update({"M": x["N"] * o["H"] * o["W"], "N": conv["O"], "K": conv["C"] * k["H"] * k["W"]})
        return conv


class QGroupedConv2dGroup(QConv2dGroup):
    """A grouped ``qconv2d`` (``groups`` > 1, depthwise included), NCHW/OIHW at batch 1, where
    each group's input and output channels are one contiguous run of the data and output."""

    kind: ClassVar[str] = "qconv2d_grouped"

    @classmethod
    def _claims(cls, params: dict) -> bool:
        a = params["anchor_attrs"]
        groups = a.get("groups", 1)
        if groups < 2 or (a["data_layout"], a["kernel_layout"]) != ("NCHW", "OIHW"):
            return False
        xs = params["inputs"][params["anchor_inputs"][0]][0]
        o = params["output"][0][1]
        return xs[0] == 1 and xs[1] % groups == 0 and o % groups == 0


class QDepthwiseConv2dGroup(QGroupedConv2dGroup):
    """A depthwise ``qconv2d``: one input channel per group (``geometry``: C 1, N = O / groups)."""

    kind: ClassVar[str] = "qdepthwise_conv2d"

    @classmethod
    def _claims(cls, params: dict) -> bool:
        xs = params["inputs"][params["anchor_inputs"][0]][0]
        return super()._claims(params) and params["anchor_attrs"].get("groups", 1) == xs[1]
