"""Run one tuner process on a test template (used by the robustness tests as a subprocess).

usage: python tests/tune_script.py DB_URL TRIALS SEED [SLEEP_MS] [LOG]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fault_templates import VariantGemm  # noqa: E402

from tuner.db.store import Store  # noqa: E402
from workloads.errors import TunerError  # noqa: E402
from tuner.measure.measurer import MeasureOptions  # noqa: E402
from tuner.target import host_target  # noqa: E402
from tuner.tuning import TuneOptions, tune  # noqa: E402
from workloads.gemm import Gemm  # noqa: E402


def main() -> int:
    url, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sleep_ms = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    log = sys.argv[5] if len(sys.argv) > 5 else None
    try:
        s = tune(Gemm.parse("16x16x16"), VariantGemm(24, sleep_ms), Store(url), host_target(),
                 TuneOptions(strategy="random", trials=trials, seed=seed, threads=1, batch_size=2,
                             progress=False, remeasure_top=0, log_path=log),
                 MeasureOptions(threads=1, repeat=3, min_repeat_ms=1, max_time_s=1, build_workers=1))
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"measured={s.measured} resumed={s.resumed} stop={s.stop_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
