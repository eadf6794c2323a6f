"""``python -m tuner target``: what this machine is, as records will name it."""
from __future__ import annotations

from tuner.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("target", help="print this machine's target (CPU, ISA, cores, caches, versions)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args) -> int:
    from tuner.target import host_target

    t = host_target()
    if args.json:
        print_json(t.to_dict())
    else:
        print(t.describe())
    return 0
