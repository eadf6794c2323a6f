"""Padded hand-offs: a direct conv writes its padded consumer's input in place.

A direct NHWC convolution (``window_nhwc``) with padding reads a zero-bordered copy of its
image, made per call by its ``pad_image``: ResNet-50 copies 7.5 MB per run that way (~0.7 ms
of 77 ms at 1 thread, most of what its 3 x 3 layers lose to ONNX Runtime's; docs/models.md,
"Where ResNet-50's last percent sits"). Where the image is computed by another direct conv
and read by nothing else, the build gives that value a buffer of the *padded* shape, zeroed
once and shared with no other value, and

- the producer stores its output pixels into the buffer's interior (its runtime dimensions
  ``OPT, OPL, OHP, OWP``: ``search_spaces.gemm_engine.core.out_rows``),
- the consumer reads the buffer as its padded image and copies nothing (``PREPAD = 1``).

Both kernels are the same compiled modules as without the hand-off (the placement is runtime
arguments), and the results are bit-identical. ``Step.out`` is the value's interior (what
the graph computes), for step-by-step checks.

The same placement serves NHWC concatenations over channels (``ChannelSlot``): an input's
channels are not a contiguous slice of the concatenation there (in NCHW they are, and the
build computes them in place already: ``compile_model._concat_slots``), so where every input
is a direct conv read by the concatenation alone, each producer stores its pixels OLD
channels apart from channel OCO on (``core.out_rows``) and the concatenation is a view.
SqueezeNet's eight fire modules (AMD Zen 4, 2026-12-07): 1.016-1.023x at 1 thread, 1.030x at
2, bit-identical (docs/models.md, "Concatenations over channels in place").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from search_spaces.templates.conv2d import HANDOFF_DIMS, Conv2dTemplate


@dataclass
class Handoff:
    """Value ``value``, written by its group (a group is named after the value it computes)
    into the interior of a padded buffer that group ``consumer`` reads as its zero-padded
    image."""

    value: str
    consumer: str
    shape: tuple[int, ...]        # the padded buffer: (N, HP, WP, C)
    top: int                      # interior offset: rows
    left: int                     # and columns
    interior: tuple[int, ...]     # the value: (N, H, W, C)

    def producer_dims(self) -> dict[str, int]:
        _, hp, wp, _ = self.shape
        return dict(zip((d.lower() for d in HANDOFF_DIMS), (self.top, self.left, hp, wp)))

    def view(self, padded: np.ndarray) -> np.ndarray:
        """The value inside its padded buffer."""
        n, h, w, c = self.interior
        return padded[:, self.top:self.top + h, self.left:self.left + w, :]


def _direct(k) -> bool:
    """A generated conv2d kernel reading its image through windows (``window_nhwc``)."""
    if k is None or k.source == "numpy" or k.template is None or k.template.name != "conv2d":
        return False
    t = k.template
    return t.a_source(t.plan(k.workload), dict(k.config)) == "window_nhwc"


def _placeable(k) -> bool:
    """A direct conv whose output can be placed inside a larger array: its epilogue has no
    operand sized by the output array (``general``), and it takes the placement dims."""
    if not _direct(k):
        return False
    pw = k.workload
    if "general" in k.template.epilogue(pw, k.template.plan(pw)).operands.values():
        return False
    return set(d.lower() for d in HANDOFF_DIMS) <= set(k.template.runtime_arg_names(pw, k.config))


def _readers(groups) -> dict[str, list[str]]:
    """Value -> the groups reading it (each once)."""
    readers: dict[str, list[str]] = {}
    for n in groups:
        for v in set(n.inputs):
            readers.setdefault(v, []).append(n.name)
    return readers


def find_handoffs(groups, kernels: dict, kinds: dict, alias: dict, outputs) -> dict[str, Handoff]:
    """The values a producer can write into its consumer's padded image (see the module
    docstring): both direct convs, the value read by that consumer alone (not a graph output,
    no view or in-place concat into it), same shape, and a producer epilogue whose operands
    are not broadcast to the output's shape (``general``: sized by the output array)."""
    readers = _readers(groups)
    viewed = set(alias.values())
    out: dict[str, Handoff] = {}
    for node in groups:
        k = kernels.get(node.name)
        if not _direct(k):
            continue
        w, t = k.workload, k.template
        names = t.runtime_arg_names(w, k.config)
        if "prepad" not in names:        # a conv without padding reads its image in place
            continue
        x_idx = w.p["anchor_inputs"][0]
        v = node.inputs[x_idx]
        param = node.body.inputs[x_idx].name
        if len(node.body.users.get(param, ())) != 1:   # also an epilogue operand
            continue
        p = kernels.get(v)
        if (kinds.get(v) != "kernel" or not _placeable(p) or v in outputs or v in viewed
                or v in alias or readers.get(v) != [node.name] or node.inputs.count(v) != 1):
            continue
        pw = p.workload
        g = w.geometry
        pg = pw.geometry
        shape = (g["N"], g["H"], g["W"], g["C"])
        if (pg["N"], pg["OH"], pg["OW"], pg["O"]) != shape or pw.dtype != w.dtype:
            continue
        hp, wp = Conv2dTemplate.padded(g)
        out[v] = Handoff(v, node.name, (g["N"], hp, wp, g["C"]), g["PT"], g["PL"], shape)
    return out


@dataclass
class ChannelSlot:
    """Value ``value``, written by its group into channels ``first`` .. ``first + channels``
    of the NHWC concatenation ``concat`` (``width`` channels per pixel), which then copies
    nothing."""

    value: str
    concat: str
    first: int
    channels: int
    width: int

    def producer_dims(self) -> dict[str, int]:
        return {"old": self.width, "oco": self.first}

    def view(self, cat: np.ndarray) -> np.ndarray:
        """The value inside the concatenation's array."""
        return cat[..., self.first:self.first + self.channels]


def find_channel_slots(groups, kernels: dict, kinds: dict, alias: dict, outputs,
                       handoffs: dict) -> dict[str, ChannelSlot]:
    """The inputs of NHWC concatenations over channels that their producers can write in place
    (a concatenation whose slices are contiguous is already a view: ``kinds`` "concat"): a
    group that is one ``concatenate`` on the last axis of 4-D values, every input computed by
    a direct conv (``_placeable``) of the same dtype, read by that concatenation alone, not a
    graph output, a view or a hand-off. Value -> its slot."""
    readers = _readers(groups)
    viewed = set(alias.values()) | set(alias)
    out: dict[str, ChannelSlot] = {}
    for node in groups:
        if kinds.get(node.name) != "kernel" or node.body is None or node.name in outputs:
            continue
        ops = [n for n in node.body.nodes if n.is_compute]
        if len(ops) != 1 or ops[0].op != "concatenate" or len(node.type.shape) != 4:
            continue
        cat = ops[0]
        if cat.attrs["axis"] % 4 != 3 or len(set(node.inputs)) != len(node.inputs):
            continue
        pidx = {p.name: k for k, p in enumerate(node.body.inputs)}
        if any(i not in pidx for i in cat.inputs):
            continue
        outer = [node.inputs[pidx[i]] for i in cat.inputs]
        ok = all(kinds.get(v) == "kernel" and _placeable(kernels.get(v)) and v not in outputs
                 and v not in viewed and v not in handoffs and readers.get(v) == [node.name]
                 and kernels[v].workload.dtype == node.type.dtype for v in outer)
        if not ok:
            continue
        width, first = node.type.shape[3], 0
        for v, p in zip(outer, cat.inputs):
            c = node.body.type_of(p).shape[3]
            out[v] = ChannelSlot(v, node.name, first, c, width)
            first += c
    return out


def runtime_overrides(handoffs: dict[str, Handoff],
                      slots: dict[str, ChannelSlot] | None = None) -> dict[str, dict[str, int]]:
    """Group -> the runtime dimensions its kernel takes other than its workload's defaults."""
    over: dict[str, dict[str, int]] = {}
    for h in handoffs.values():
        over.setdefault(h.value, {}).update(h.producer_dims())
        over.setdefault(h.consumer, {})["prepad"] = 1
    for s in (slots or {}).values():
        over.setdefault(s.value, {}).update(s.producer_dims())
    return over


def runtime_args(k, overrides: dict[str, int]) -> tuple:
    """Kernel ``k``'s runtime arguments with ``overrides`` (by name) applied."""
    names = k.template.runtime_arg_names(k.workload, k.config)
    args = dict(zip(names, k.template.runtime_args(k.workload, k.config)))
    unknown = set(overrides) - set(args)
    if unknown:
        raise AssertionError(f"{k.node.name}: no runtime dimension(s) {sorted(unknown)}")
    args.update(overrides)
    return tuple(args.values())
