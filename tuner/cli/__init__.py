"""Command line: ``python -m tuner <command> ...``.

Each command lives in its own module under ``tuner.cli`` and exposes ``register(subparsers)``;
heavy imports (numba, optuna, sklearn) happen inside the command's handler, so ``--help``
stays fast. To add a command: write the module, add its name to ``COMMAND_MODULES``.

Errors: a ``TunerError`` (bad input, missing record in strict mode, unreadable database, ...)
is printed as one line ``error: ...`` and exits with code 2; never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Order is the order shown in --help.
COMMAND_MODULES = [
    "tuner.cli.target_cmd",
    "tuner.cli.tune_cmd",
    "tuner.cli.tasks_cmd",
    "tuner.cli.show_cmd",
    "tuner.cli.run_cmd",
    "tuner.cli.db_cmd",
    "tuner.cli.bench_cmd",
    "tuner.cli.passes_cmd",
    "tuner.cli.replay_cmd",
    "tuner.cli.build_cmd",
    "tuner.cli.model_cmd",
    "tuner.cli.quantize_cmd",
]


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on bad usage already; keep its message to one line."""

    def error(self, message: str) -> None:  # pragma: no cover - argparse path
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tuner", description="Autotuning of CPU tensor kernels.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from workloads.errors import TunerError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from tuner import settings

        settings.apply_cpu_override()   # TUNER_CPU: before anything compiles
        return int(args.handler(args) or 0)
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tuner db list | head`
        return 0
