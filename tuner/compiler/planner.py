"""The memory planner: liveness-based reuse of intermediate buffers.

Each step of a built module writes one value. A value is live from the step that writes it to
the last step that reads it (graph outputs: to the end). Values that are views of another
(a reshape run as a view) extend the life of the buffer they look into. Walking the steps in
order, a value takes the smallest free buffer of its dtype that is large enough, else grows
the largest free one, else opens a new one; buffers are freed after the step of the last
read. A step's output never shares a buffer with its inputs (they are live during the step).
A value some earlier steps write into (a concatenation whose inputs are computed in place,
as views of its slices) takes its buffer when the first of them runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tuner.compiler.arena import slices


@dataclass
class Plan:
    sizes: list[int] = field(default_factory=list)        # bytes of each buffer
    dtypes: list[str] = field(default_factory=list)
    assign: dict[str, int] = field(default_factory=dict)  # value -> buffer
    naive_bytes: int = 0                                   # one buffer per value

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def add_own(self, value: str, nbytes: int, dtype: str) -> None:
        """A buffer for ``value`` alone (a value ``plan_memory`` was told the caller owns)."""
        self.assign[value] = len(self.sizes)
        self.sizes.append(nbytes)
        self.dtypes.append(dtype)

    def allocate(self) -> list[np.ndarray]:
        """The buffers, uninitialised, in one block on huge pages (``tuner.compiler.arena``)."""
        return slices(self.sizes, self.dtypes)


def plan_memory(steps: list[tuple[str, tuple[str, ...]]], nbytes: dict[str, int],
                dtypes: dict[str, str], keep: set[str], alias: dict[str, str] | None = None,
                own: set[str] = frozenset()) -> Plan:
    """Plan buffers for the values written by ``steps`` [(output, inputs)], in order.

    ``nbytes``/``dtypes`` describe every planned value; inputs that are not planned (graph
    inputs, constants) are ignored. ``keep``: values live to the end (graph outputs).
    ``alias``: view value -> the value whose buffer it looks into (no buffer of its own); the
    view may be written before that value's own step (the inputs of an in-place concat).
    ``own``: values the caller gives buffers of their own (not planned, not shared:
    ``Plan.add_own``).
    """
    alias = alias or {}

    def root(v: str) -> str:
        while v in alias:
            v = alias[v]
        return v

    planned = {out for out, _ in steps if out not in alias and out not in own}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, (out, ins) in enumerate(steps):
        r = root(out)
        first.setdefault(r, i)
        last[r] = max(last.get(r, i), i)
        for v in ins:
            r = root(v)
            if r in planned:
                last[r] = max(last.get(r, i), i)
    end = len(steps)
    for v in keep:
        if root(v) in planned:
            last[root(v)] = end
    opens: dict[int, list[str]] = {}
    for r in planned:     # a value opens its buffer when it, or a view into it, is first written
        opens.setdefault(first[r], []).append(r)

    plan = Plan()
    free: list[int] = []
    releases: dict[int, list[int]] = {}
    order = {out: i for i, (out, _) in enumerate(steps)}
    for i in range(len(steps)):
        for b in releases.pop(i - 1, []):
            free.append(b)
        for r in sorted(opens.get(i, []), key=order.__getitem__):
            need, dt = nbytes[r], dtypes[r]
            plan.naive_bytes += need
            same = [b for b in free if plan.dtypes[b] == dt]
            fits = [b for b in same if plan.sizes[b] >= need]
            if fits:
                b = min(fits, key=lambda k: plan.sizes[k])
            elif same:
                b = max(same, key=lambda k: plan.sizes[k])
                plan.sizes[b] = need
            else:
                b = len(plan.sizes)
                plan.sizes.append(need)
                plan.dtypes.append(dt)
            if b in free:
                free.remove(b)
            plan.assign[r] = b
            releases.setdefault(last[r], []).append(b)
    return plan
