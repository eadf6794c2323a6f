"""``python -m tuner target``: what this machine is, as records will name it."""
from __future__ import annotations

from tuner.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("target", help="print this machine's target (CPU, ISA, cores, caches, versions)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--peak", action="store_true",
                   help="also measure one core's FMA throughput (fp32, fp64; ~1 s): the "
                        "ceiling no kernel can beat, what bench gemm's %% peak divides by")
    p.set_defaults(handler=run)


def run(args) -> int:
    from tuner.target import host_target

    t = host_target()
    peak = None
    if args.peak:
        from tuner.bench.peak import measured_fma_gflops

        peak = {d: round(measured_fma_gflops(d), 1) for d in ("float32", "float64")}
    if args.json:
        print_json({**t.to_dict(), **({"peak_gflops_per_core": peak} if peak else {})})
    else:
        print(t.describe())
        if peak:
            print(f"peak       : {peak['float32']:.0f} fp32 / {peak['float64']:.0f} fp64 GFLOPS per "
                  "core (measured FMA throughput at the compile target's vector width)")
    return 0
