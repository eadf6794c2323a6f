"""Workloads for fused groups: one per group that FuseOps makes (``workload_for_group``).

Kinds (each registered in ``workloads.REGISTRY``):

- ``conv2d``: a ``conv2d`` anchor (float; ungrouped or grouped with more than one input
  channel per group) with its elementwise epilogue;
- ``depthwise_conv2d``: a depthwise ``conv2d`` anchor (groups == input channels);
- ``dense``: a ``dense`` (data[..., K] x weight[N, K]^T) or 2-D-weight ``matmul``
  (data[..., K] x weight[K, N]) anchor with its epilogue;
- ``injective``: elementwise / broadcast / injective groups (chains or small DAGs);
- ``fixed``: everything else (pools, softmax, lrn, batch_matmul ...).

Parameters are the group description's canonical params (``GroupDescription.params()``: anchor,
its attributes, input and output types, ordered epilogue), so the key is identical wherever the
group is described, and weights' values are never part of it. A group whose body is not a
chain (an injective DAG such as ``concat(relu(a), relu(b))``) also carries its body as
canonical IR text (values renamed ``p<k>``/``t<k>``). The reference executes the body with
``workloads.graph``'s NumPy executor; the check's tolerance depends on the dtype, the reduction
length and how the epilogue propagates the anchor's rounding error.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from workloads.errors import UsageError
from workloads.workload import Workload, first_difference, outside_tolerance
from workloads.fused_body import build_body, canonical_body_text, is_chain

FLOAT = ("float32", "float64")


# -- the workloads ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FusedWorkload(Workload):
    """A fused group as a workload; ``spec`` is the canonical JSON of its params."""

    spec: str

    kind: ClassVar[str] = "fused"

    def __post_init__(self) -> None:
        p = self.p  # parse and validate once
        for key in ("anchor", "anchor_attrs", "anchor_inputs", "epilogue", "inputs", "output", "ops"):
            if key not in p:
                raise UsageError(f"{self.kind} workload parameters lack {key!r}")
        if p.get("prologue") and self.kind != "conv2d":
            raise UsageError(f"a {self.kind} workload has no prologue (only conv2d takes one)")
        self.body  # noqa: B018 - rebuilding checks the params

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FusedWorkload) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @cached_property
    def p(self) -> dict:
        try:
            return json.loads(self.spec)
        except json.JSONDecodeError as exc:
            raise UsageError(f"bad fused workload params: {exc}") from None

    @cached_property
    def body(self):
        return build_body(self.p)

    def params(self) -> dict[str, Any]:
        return json.loads(self.spec)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "FusedWorkload":
        if not isinstance(params, dict):
            raise UsageError(f"{cls.kind} parameters must be an object")
        return cls(json.dumps(params, sort_keys=True, separators=(",", ":")))

    # -- types ----------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return self.p["output"][1]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.p["output"][0])

    def input_specs(self):
        return [(tuple(s), d) for s, d in self.p["inputs"]]

    def output_specs(self):
        return [(self.out_shape, self.dtype)]

    @property
    def epilogue(self) -> list[dict]:
        return self.p["epilogue"]

    @property
    def prologue(self) -> list[dict]:
        """Ops on the anchor's data input before the anchor (``[]`` for most groups)."""
        return self.p.get("prologue", [])

    @property
    def anchor(self) -> str | None:
        return self.p["anchor"]

    @property
    def attrs(self) -> dict:
        return self.p["anchor_attrs"]

    @property
    def shape_str(self) -> str:
        """Short human description (progress bars, tables)."""
        ins = ",".join("x".join(map(str, s)) for s, _ in self.p["inputs"][:2])
        return f"{'+'.join(self.p['ops'])}({ins})"

    def summary(self) -> str:
        if not self.anchor:
            return " -> ".join(self.p["ops"])
        epi = " -> ".join(e["op"] for e in self.epilogue)
        head = self.anchor
        if self.prologue:
            head = "[" + " -> ".join(e["op"] for e in self.prologue) + "] -> " + head
        return head + (f" + [{epi}]" if epi else "")

    # -- inputs, reference, check -----------------------------------------------------------
    def make_inputs(self, seed: int = 0) -> list[np.ndarray]:
        arrays = super().make_inputs(seed)
        if any(op in ("sqrt",) for op in self.p["ops"]):
            arrays = [np.abs(a) for a in arrays]
        return arrays

    def reference(self, inputs):
        from workloads.graph import execute

        return [np.asarray(execute(self.body, list(inputs))[0])]

    def reduction_length(self) -> int:
        return 1

    def epilogue_flops(self) -> int:
        n = math.prod(self.out_shape)
        flops = n * sum(1 for e in self.epilogue if e["op"] not in _MOVEMENT)
        if self.prologue:
            x = math.prod(self.p["inputs"][self.p["anchor_inputs"][0]][0])
            flops += x * sum(1 for e in self.prologue if e["op"] not in _MOVEMENT)
        return flops

    def _anchor_ref(self, inputs, absolute: bool) -> np.ndarray:
        from workloads.graph.ops import get_op
        from workloads.graph.ir import Attrs

        op = get_op(self.anchor)
        args = [inputs[i].astype(np.float64) for i in self.p["anchor_inputs"]]
        if self.prologue:
            args[0] = self._run_ops(self.prologue, args[0], inputs)
        if absolute:
            args = [np.abs(a) for a in args]
        attrs = op.make_attrs(self.attrs)
        with np.errstate(all="ignore"):
            return np.asarray(op.compute(args, Attrs(attrs)), dtype=np.float64)

    def _run_epilogue(self, y: np.ndarray, inputs) -> np.ndarray:
        return self._run_ops(self.epilogue, y, inputs)

    @staticmethod
    def _run_ops(ops: list[dict], y: np.ndarray, inputs) -> np.ndarray:
        from workloads.graph.ops import get_op

        for e in ops:
            args = [inputs[k].astype(np.float64) for k, *_ in e["others"]]
            args.insert(e["operand"], y)
            op = get_op(e["op"])
            with np.errstate(all="ignore"):
                y = np.asarray(op.compute(args, op.make_attrs(e["attrs"])), dtype=np.float64)
        return y

    def tolerance(self, inputs, expected: np.ndarray) -> np.ndarray:
        """Per-element absolute tolerance.

        With an anchor (or pooling) op: its accumulated rounding is at most about
        ``(4 sqrt(R) + 16) eps (op applied to |inputs|)`` (R the reduction length, as for
        GEMM), propagated through the epilogue numerically (the epilogue evaluated at
        ``y +- e``), plus a few ulps of the result. Without one: a few ulps (data movement
        is exact; elementwise math differs by an ulp or two between libraries).
        """
        dt = np.dtype(self.dtype)
        ref = np.abs(expected.astype(np.float64))
        if dt.kind != "f":
            return np.zeros(expected.shape)
        eps = float(np.finfo(dt).eps)
        r = self.reduction_length()
        if self.anchor is not None and not self.p.get("body"):
            y = self._anchor_ref(inputs, False)
            e = (4 * math.sqrt(r) + 16) * eps * self._anchor_ref(inputs, True) + 4 * eps * np.abs(y)
            f = self._run_epilogue(y, inputs)
            spread = np.maximum(np.abs(self._run_epilogue(y + e, inputs) - f),
                                np.abs(self._run_epilogue(y - e, inputs) - f))
            spread = np.where(np.isfinite(spread), spread, np.inf)
            return spread + 16 * eps * (ref + np.abs(f)) + 1e-30
        return (4 * math.sqrt(r) + 16) * eps * (ref + 1e-3)

    def check(self, inputs, outputs, expected):
        (c,), (ref,) = outputs, expected
        if c.shape != ref.shape:
            return f"output shape {c.shape} != expected {ref.shape}"
        if np.dtype(self.dtype).kind != "f":
            return first_difference(c, ref, c.astype(np.int64) != ref.astype(np.int64))
        finite = np.isfinite(ref)
        if not np.isfinite(c[finite]).all():
            n = int((~np.isfinite(c) & finite).sum())
            return f"{n} of {c.size} elements are NaN/inf (unwritten or overflow)"
        err = np.where(finite, np.abs(c.astype(np.float64) - ref.astype(np.float64)), 0.0)
        return outside_tolerance(c, ref, err, self.tolerance(inputs, ref))


_MOVEMENT = {"reshape", "flatten", "transpose", "layout_transform", "concatenate", "expand_dims",
             "squeeze", "dropout", "constant_of_shape"}


def _conv_groups(params: dict) -> tuple[int, int] | None:
    """(groups, input channels) of a float conv2d group; None for any other group."""
    if params["anchor"] != "conv2d" or params["output"][1] not in FLOAT:
        return None
    xs = params["inputs"][params["anchor_inputs"][0]][0]
    return (params["anchor_attrs"].get("groups", 1),
            xs[params["anchor_attrs"]["data_layout"].index("C")])


@dataclass(frozen=True, eq=False)
class Conv2dGroup(FusedWorkload):
    kind: ClassVar[str] = "conv2d"
    nominal_flops_rate: ClassVar[float] = 20e9

    @classmethod
    def claims_group(cls, params: dict) -> bool:
        """Ungrouped and grouped convolutions with more than one input channel per group
        (depthwise ones are ``DepthwiseConv2dGroup``'s)."""
        gc = _conv_groups(params)
        return gc is not None and (gc[0] == 1 or gc[1] // gc[0] > 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.anchor != "conv2d":
            raise UsageError(f"conv2d workload needs a conv2d anchor, got {self.anchor!r}")
        self.geometry  # noqa: B018

    @cached_property
    def geometry(self) -> dict:
        """N, C, H, W, O, KH, KW, OH, OW, strides, padding, dilation, layouts."""
        a = self.attrs
        dl, kl = a["data_layout"], a["kernel_layout"]
        (xs, _), (ws, _) = (self.p["inputs"][i] for i in self.p["anchor_inputs"])
        g = {ch: xs[dl.index(ch)] for ch in "NCHW"}
        k = {ch: ws[kl.index(ch)] for ch in "OIHW"}
        o = dict(zip(dl, self.out_shape))
        return {"N": g["N"], "C": g["C"], "H": g["H"], "W": g["W"], "O": k["O"],
                "KH": k["H"], "KW": k["W"], "OH": o["H"], "OW": o["W"],
                "SH": a["strides"][0], "SW": a["strides"][1],
                "PT": a["padding"][0], "PL": a["padding"][1],
                "DH": a["dilation"][0], "DW": a["dilation"][1], "groups": a["groups"],
                "data_layout": dl, "kernel_layout": kl}

    def reduction_length(self) -> int:
        g = self.geometry
        return g["C"] // g["groups"] * g["KH"] * g["KW"]

    def flops(self) -> int:
        g = self.geometry
        return 2 * g["N"] * g["O"] * g["OH"] * g["OW"] * self.reduction_length() + self.epilogue_flops()


@dataclass(frozen=True, eq=False)
class DepthwiseConv2dGroup(Conv2dGroup):
    """A depthwise conv2d (groups == input channels; O a multiple of C) with its epilogue."""

    kind: ClassVar[str] = "depthwise_conv2d"
    nominal_flops_rate: ClassVar[float] = 5e9

    @classmethod
    def claims_group(cls, params: dict) -> bool:
        gc = _conv_groups(params)
        return gc is not None and 1 < gc[0] == gc[1]


@dataclass(frozen=True, eq=False)
class DenseGroup(FusedWorkload):
    kind: ClassVar[str] = "dense"
    nominal_flops_rate: ClassVar[float] = 10e9

    @classmethod
    def claims_group(cls, params: dict) -> bool:
        anchor = params["anchor"]
        if anchor not in ("dense", "matmul") or params["output"][1] not in FLOAT:
            return False
        xs, ws = (params["inputs"][i][0] for i in params["anchor_inputs"])
        return len(ws) == 2 and len(xs) >= (1 if anchor == "dense" else 2)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.anchor not in ("dense", "matmul"):
            raise UsageError(f"dense workload needs a dense/matmul anchor, got {self.anchor!r}")
        self.geometry  # noqa: B018

    @cached_property
    def geometry(self) -> dict:
        """M (rows of data), N (outputs), K; ``weight`` 'NK' (dense) or 'KN' (matmul)."""
        (xs, _), (ws, _) = (self.p["inputs"][i] for i in self.p["anchor_inputs"])
        if len(ws) != 2 or len(xs) < 1:
            raise UsageError(f"dense workload needs data[..., K] and a 2-D weight, got {xs} x {ws}")
        if self.anchor == "dense":
            n, k, layout = ws[0], ws[1], "NK"
        else:
            if len(xs) < 2:
                raise UsageError("matmul with a 1-D data operand is not a dense workload")
            k, n, layout = ws[0], ws[1], "KN"
        return {"M": math.prod(xs[:-1]), "N": n, "K": k, "weight": layout}

    def reduction_length(self) -> int:
        return self.geometry["K"]

    def flops(self) -> int:
        g = self.geometry
        return 2 * g["M"] * g["N"] * g["K"] + self.epilogue_flops()


@dataclass(frozen=True, eq=False)
class InjectiveGroup(FusedWorkload):
    kind: ClassVar[str] = "injective"
    nominal_flops_rate: ClassVar[float] = 2e9

    @classmethod
    def claims_group(cls, params: dict) -> bool:
        return params["anchor"] is None and params["kind"] in ("elemwise", "broadcast", "injective")

    def flops(self) -> int:
        return max(1, self.epilogue_flops()) if not self.p.get("body") else \
            math.prod(self.out_shape) * max(1, sum(1 for o in self.p["ops"] if o not in _MOVEMENT))


@dataclass(frozen=True, eq=False)
class FixedGroup(FusedWorkload):
    """Everything no other kind claims (pools, softmax, lrn, batch_matmul, non-float conv, ...)."""

    kind: ClassVar[str] = "fixed"

    @classmethod
    def claims_group(cls, params: dict) -> bool:
        return True

    def main_op(self) -> str:
        return self.anchor or self.p["ops"][0]

    def reduction_length(self) -> int:
        a = self.attrs if self.anchor else (self.epilogue[0]["attrs"] if self.epilogue else {})
        op = self.main_op()
        if op in ("max_pool2d", "avg_pool2d"):
            return int(np.prod(a["pool_size"]))
        if op == "global_avg_pool2d":
            shp, _ = self.p["inputs"][0]
            lay = a["layout"]
            return shp[lay.index("H")] * shp[lay.index("W")]
        if op == "softmax":
            shp, _ = self.p["inputs"][0]
            return shp[a["axis"]]
        if op == "lrn":
            return a["size"]
        if op in ("conv2d",):
            return Conv2dGroup.reduction_length(self)  # type: ignore[arg-type]
        if op in ("batch_matmul", "matmul", "dense"):
            return self.p["inputs"][0][0][-1]
        return 1

    @property
    def geometry(self) -> dict:  # used by reduction_length for grouped conv
        return Conv2dGroup.geometry.func(self)  # type: ignore[attr-defined]

    def flops(self) -> int:
        out = math.prod(self.out_shape)
        op = self.main_op()
        if op in ("conv2d", "batch_matmul", "matmul", "dense"):
            return 2 * out * self.reduction_length() + self.epilogue_flops()
        if op == "softmax":
            return 4 * out + self.epilogue_flops()
        return out * max(1, self.reduction_length()) + self.epilogue_flops()


def kind_of(params: dict) -> str:
    """Which workload kind a described group becomes: the first registered group kind that
    claims it (``workloads.group_kinds``: registration priority, then order; ``fixed`` last)."""
    from workloads import group_kinds

    return next(cls.kind for cls in group_kinds() if cls.claims_group(params))


def group_params(node_or_description) -> dict:
    """Canonical params of a fused node or a ``GroupDescription`` (body text for DAG groups)."""
    from workloads.graph.fusion import GroupDescription, describe
    from workloads.graph.graph_errors import GraphError
    from workloads.graph.ir import Node

    body = None
    if isinstance(node_or_description, Node):
        try:
            desc = describe(node_or_description)
        except GraphError as exc:
            raise UsageError(str(exc)) from None
        body = node_or_description.body
    elif isinstance(node_or_description, GroupDescription):
        desc = node_or_description
    else:
        raise UsageError(f"workload_for_group needs a fused Node or a GroupDescription, "
                         f"got {type(node_or_description).__name__}")
    params = json.loads(desc.key)
    if not is_chain(params):
        if body is None:
            raise UsageError(f"group {desc.name} ({desc.summary()}) is not a chain; pass the fused "
                             "node (its body is needed), not only its description")
        params["body"] = canonical_body_text(body)
    return params


def workload_for_group(node_or_description) -> FusedWorkload:
    """The workload of one fused group (a fused ``Node`` or a ``GroupDescription``)."""
    params = group_params(node_or_description)
    import workloads

    return workloads.workload_class(kind_of(params)).from_params(params)
