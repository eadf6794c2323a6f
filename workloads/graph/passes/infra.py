"""Pass infrastructure: PassInfo, Pass, PassContext, Sequential and pass instruments.

A pass is a named pure function ``Graph -> Graph`` with metadata (``PassInfo``: name,
opt_level, required passes). ``@graph_pass(name, opt_level)`` turns such a function into a
pass constructor: ``FuseOps(max_group_size=8)`` returns a ``Pass`` whose options are bound.
``Sequential`` runs passes in order under a ``PassContext`` (opt_level, disabled passes,
instruments, verification); a pass that fails is reported with the passes that ran before it.
"""
from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence, TextIO

from workloads.errors import TunerError, UsageError
from workloads.graph.graph_errors import PassError
from workloads.graph.ir import Graph


@dataclass(frozen=True)
class PassInfo:
    name: str
    opt_level: int
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pass:
    """A pass with its options bound; ``pass_(graph)`` applies it (no context, no checks)."""

    info: PassInfo
    fn: Callable[[Graph], Graph]
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return self.info.name

    def __call__(self, graph: Graph) -> Graph:
        return self.fn(graph)

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"{self.info.name}({opts})"


PassConstructor = Callable[..., Pass]
PASS_REGISTRY: dict[str, PassConstructor] = {}


def graph_pass(name: str, opt_level: int, required: Sequence[str] = ()) -> Callable:
    """Decorator: ``fn(graph, **options) -> Graph`` becomes the constructor ``name(**options)``."""
    info = PassInfo(name, opt_level, tuple(required))

    def wrap(fn: Callable[..., Graph]) -> PassConstructor:
        def make(**options: Any) -> Pass:
            bound = functools.partial(fn, **options) if options else fn
            return Pass(info, bound, tuple(sorted(options.items())))

        make.__name__ = make.__qualname__ = name
        make.__doc__ = fn.__doc__
        make.info = info  # type: ignore[attr-defined]
        make.fn = fn  # type: ignore[attr-defined]
        PASS_REGISTRY[name] = make
        return make

    return wrap


def pass_names() -> list[str]:
    return sorted(PASS_REGISTRY)


# ---- instruments ----------------------------------------------------------------------

class PassInstrument:
    """Hooks called by ``Sequential`` around each pass; subclasses override what they need."""

    def before(self, p: Pass, graph: Graph) -> None: ...

    def after(self, p: Pass, before: Graph, after: Graph, seconds: float) -> None: ...

    def skipped(self, p: Pass, reason: str) -> None: ...


class PassTiming(PassInstrument):
    """Wall time of each pass run, in order."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []

    def after(self, p: Pass, before: Graph, after: Graph, seconds: float) -> None:
        self.times.append((p.name, seconds))

    def render(self) -> str:
        total = sum(s for _, s in self.times)
        lines = [f"{name:<26}{s * 1e3:9.2f} ms" for name, s in self.times]
        return "\n".join(lines + [f"{'total':<26}{total * 1e3:9.2f} ms"])


class PassRecorder(PassInstrument):
    """Keeps (pass, graph after it, seconds) for every pass that ran, and skipped passes;
    ``events`` has both in order: ``(pass, graph, seconds, None)`` or ``(pass, None, 0, reason)``."""

    def __init__(self) -> None:
        self.runs: list[tuple[Pass, Graph, float]] = []
        self.skips: list[tuple[Pass, str]] = []
        self.events: list[tuple[Pass, Graph | None, float, str | None]] = []

    def after(self, p: Pass, before: Graph, after: Graph, seconds: float) -> None:
        self.runs.append((p, after, seconds))
        self.events.append((p, after, seconds, None))

    def skipped(self, p: Pass, reason: str) -> None:
        self.skips.append((p, reason))
        self.events.append((p, None, 0.0, reason))


class DumpIR(PassInstrument):
    """Prints the IR before and/or after each pass (large constants elided by default)."""

    def __init__(self, before: bool = False, after: bool = True, stream: TextIO | None = None,
                 elide: bool = True) -> None:
        self.dump_before, self.dump_after, self.elide = before, after, elide
        self.stream = stream

    def _write(self, title: str, graph: Graph) -> None:
        from workloads.graph.text import to_text
        out = self.stream or sys.stdout
        out.write(f"# ---- {title}\n{to_text(graph, elide=self.elide)}\n")

    def before(self, p: Pass, graph: Graph) -> None:
        if self.dump_before:
            self._write(f"IR before {p.name}", graph)

    def after(self, p: Pass, before: Graph, after: Graph, seconds: float) -> None:
        if self.dump_after:
            if after == before:
                (self.stream or sys.stdout).write(f"# ---- IR after {p.name}: unchanged\n")
            else:
                self._write(f"IR after {p.name}", after)


# ---- context and sequential -----------------------------------------------------------

@dataclass
class PassContext:
    """How passes run: ``opt_level`` (passes above it are skipped), ``disabled`` pass names,
    ``instruments``, and ``verify`` (check the graph after every pass)."""

    opt_level: int = 2
    disabled: frozenset[str] = frozenset()
    instruments: tuple[PassInstrument, ...] = ()
    verify: bool = True

    def __post_init__(self) -> None:
        self.disabled = frozenset(self.disabled)
        unknown = sorted(self.disabled - set(PASS_REGISTRY))
        if unknown:
            raise UsageError(f"unknown pass {unknown[0]!r} to disable; known: {', '.join(pass_names())}")
        if not 0 <= self.opt_level <= 3:
            raise UsageError(f"opt_level must be 0..3, got {self.opt_level}")
        self.instruments = tuple(self.instruments)

    def skip_reason(self, p: Pass) -> str | None:
        if p.name in self.disabled:
            return "disabled"
        if p.info.opt_level > self.opt_level:
            return f"opt_level {p.info.opt_level} > {self.opt_level}"
        return None


@dataclass
class Sequential:
    """Runs ``passes`` in order. Required passes that have not run yet are run first."""

    passes: Sequence[Pass]
    name: str = "sequential"
    ran: list[str] = field(default_factory=list, init=False, repr=False)

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> Graph:
        ctx = ctx or PassContext()
        self.ran = []
        for p in self.passes:
            reason = ctx.skip_reason(p)
            if reason is not None:
                for inst in ctx.instruments:
                    inst.skipped(p, reason)
                continue
            for req in p.info.required:
                if req not in self.ran:
                    graph = self._run(PASS_REGISTRY[req](), graph, ctx)
            graph = self._run(p, graph, ctx)
        return graph

    def _run(self, p: Pass, graph: Graph, ctx: PassContext) -> Graph:
        for inst in ctx.instruments:
            inst.before(p, graph)
        after_which = f"after {', '.join(self.ran)}" if self.ran else "as the first pass"
        start = time.perf_counter()
        try:
            out = p(graph)
        except Exception as exc:  # report any failure by pass name, keep the cause chained
            kind = "" if isinstance(exc, TunerError) else f"{type(exc).__name__}: "
            raise PassError(f"pass {p.name} failed ({after_which}): {kind}{exc}",
                            pass_name=p.name, ran=tuple(self.ran)) from exc
        seconds = time.perf_counter() - start
        if not isinstance(out, Graph):
            raise PassError(f"pass {p.name} returned {type(out).__name__}, not a Graph",
                            pass_name=p.name, ran=tuple(self.ran))
        if ctx.verify:
            from workloads.graph.verify import verify
            try:
                verify(out)
            except TunerError as exc:
                raise PassError(f"pass {p.name} produced an invalid graph ({after_which}): {exc}",
                                pass_name=p.name, ran=tuple(self.ran)) from exc
        self.ran.append(p.name)
        for inst in ctx.instruments:
            inst.after(p, graph, out, seconds)
        return out

    def __str__(self) -> str:
        return " -> ".join(str(p) for p in self.passes)


def run_passes(graph: Graph, passes: Iterable[Pass], ctx: PassContext | None = None) -> Graph:
    return Sequential(list(passes))(graph, ctx)
