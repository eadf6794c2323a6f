"""One root for every error that reaches the user (the bottom of the package stack, so every
layer raises them without importing upwards; ``tuner.TunerError`` etc. name the same classes).

``TunerError`` and its subclasses carry a message meant to be printed as one line; the CLI
prints it and exits with code 2 (``UserError``-style exit). Anything else escaping is a bug.
"""
from __future__ import annotations


class TunerError(Exception):
    """Root of all errors the tuner reports to the user (CLI: one line, exit code 2)."""

    exit_code = 2


class UsageError(TunerError):
    """Bad input from the user: a malformed shape, config JSON, unknown name, ..."""


class InstantiationError(TunerError):
    """A configuration that the template cannot instantiate (status INVALID)."""


class NoRecordError(TunerError):
    """Strict mode: no tuned record exists for a workload on this target."""


class DatabaseError(TunerError):
    """The records database cannot be opened, read or written."""
