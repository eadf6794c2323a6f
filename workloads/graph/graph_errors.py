"""Errors of the graph layer; all derive from ``workloads.errors.TunerError`` (one line each)."""
from __future__ import annotations

from workloads.errors import TunerError, UsageError


class GraphError(TunerError):
    """An ill-formed or ill-typed graph. ``node`` names the offending value when known."""

    def __init__(self, message: str, *, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class ParseError(UsageError):
    """The text form of a graph could not be read; the message starts with ``line N:``."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


class PassError(TunerError):
    """A pass failed; the message names it and the passes that ran before it."""

    def __init__(self, message: str, *, pass_name: str, ran: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.pass_name = pass_name
        self.ran = ran
