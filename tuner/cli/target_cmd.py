"""``python -m tuner target``: what this machine is, as records will name it."""
from __future__ import annotations

from tuner.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("target", help="print this machine's target (CPU, ISA, cores, caches, versions)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--peak", action="store_true",
                   help="also measure one core's FMA throughput (fp32, fp64) and int8 dot-product "
                        "throughput per instruction form (~2 s): the ceilings no kernel can beat, "
                        "what bench gemm's and bench int8's %% peak divide by")
    p.set_defaults(handler=run)


def run(args) -> int:
    from tuner.target import host_target

    t = host_target()
    peak = int8 = None
    if args.peak:
        from tuner.bench.peak import core_peaks, measured_fma_gflops

        peak = {d: round(measured_fma_gflops(d), 1) for d in ("float32", "float64")}
        int8 = {d: round(g, 1) for d, g in core_peaks().items() if d != "fp32_fma_gflops"}
    if args.json:
        print_json({**t.to_dict(), **({"peak_gflops_per_core": peak, "peak_int8_gops_per_core": int8}
                                      if peak else {})})
    else:
        print(t.describe())
        if peak:
            print(f"peak       : {peak['float32']:.0f} fp32 / {peak['float64']:.0f} fp64 GFLOPS per "
                  "core (measured FMA throughput at the compile target's vector width)")
            print("int8 peak  : " + ", ".join(f"{d} {g:.0f} GOPS ({g / peak['float32']:.2f}x fp32)"
                                             for d, g in int8.items()) + " per core (measured)")
    return 0
