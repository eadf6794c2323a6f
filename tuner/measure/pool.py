"""Worker processes that may die: spawn, call with a timeout, classify, restart.

A ``Worker`` is one persistent spawned process serving ``tuner.measure.worker`` jobs over a
pipe. ``call`` returns the job's reply dict, or a synthesized reply when the process hung
(TIMEOUT: it is killed) or died (CRASH: exit code or signal, plus the tail of its log).
The next call starts a fresh process. Persistent processes matter: importing Numba costs
about a second, far more than most candidates take to run.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a Python child that imports ``tuner``: ours, plus ``extra``, with
    the directory holding the parent's ``tuner`` package first on ``PYTHONPATH``. A child runs
    the code its parent runs, also when the parent found it through ``sys.path`` (a script
    beside an uninstalled checkout, or an install pointing elsewhere): without this such a
    build's workers died on ``import tuner`` and every kernel compiled in them fell back to
    NumPy (ResNet-50 at 2 threads: 30 kernels, 280 ms instead of 44 ms, Zen 4)."""
    env = {**os.environ, **(extra or {})}
    root = str(Path(__file__).resolve().parents[2])
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env


class Worker:
    def __init__(self, name: str, env: dict[str, str] | None = None, log_dir: str | None = None):
        self.name = name
        self.env = dict(env or {})
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="tuner-worker-")
        self.log_path = str(Path(self.log_dir) / f"{name}.log")
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None  # replies from the worker
        self._send: Connection | None = None  # requests to the worker

    # -- lifecycle ---------------------------------------------------------------------
    def _start(self) -> None:
        # A plain subprocess (not multiprocessing's spawn): the user's __main__ module is
        # never re-imported, so scripts without an ``if __name__ == "__main__"`` guard work.
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        cmd = [sys.executable, "-c",
               "import sys; from tuner.measure.worker import serve; "
               "serve(int(sys.argv[1]), int(sys.argv[2]))",
               str(to_child_r), str(from_child_w)]
        with open(self.log_path, "wb") as log:
            proc = subprocess.Popen(cmd, pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env=child_env(self.env), start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._proc = proc
        self._send = Connection(to_child_w, readable=False)
        self._conn = Connection(from_child_r, writable=False)

    def kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass
        for c in (self._conn, self._send):
            if c is not None:
                c.close()
        self._proc = self._conn = self._send = None

    close = kill

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _log_tail(self, limit: int = 1500) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return text[-limit:].strip()

    # -- calls -------------------------------------------------------------------------
    def call(self, job: str, req: dict, timeout: float) -> dict:
        """Run ``job`` in the worker; never raises for anything the job or process does."""
        if not self.alive:
            self.kill()
            self._start()
        t0 = time.perf_counter()
        try:
            self._send.send((job, req))
            ready = self._conn.poll(timeout)
        except (BrokenPipeError, EOFError, OSError):
            ready = True  # fall through to recv, which reports the death
        if not ready:
            self.kill()
            return {"status": "TIMEOUT",
                    "error": f"{job} did not finish within {timeout:.0f} s; worker killed",
                    "elapsed": time.perf_counter() - t0}
        try:
            reply = self._conn.recv()
        except (EOFError, OSError, ConnectionResetError):
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
            how = _describe_exit(self._proc.poll())
            tail = self._log_tail()
            self.kill()
            msg = f"worker {how} during {job}"
            if tail:
                msg += f"; last output: {tail}"
            return {"status": "CRASH", "error": msg, "elapsed": time.perf_counter() - t0}
        reply.setdefault("elapsed", time.perf_counter() - t0)
        return reply

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.kill()
        except Exception:
            pass


def worker_env(threads: int, cache: Path) -> dict[str, str]:
    """Environment every worker starts with (read before Numba is imported); with
    ``TUNER_CPU``, Numba's CPU name and features, so workers compile for that CPU."""
    from tuner import settings

    return {
        **settings.compile_env(),
        "NUMBA_NUM_THREADS": str(max(1, threads)),
        "NUMBA_CACHE_DIR": str(cache / "numba"),
        # BLAS threads for the NumPy baseline are limited per call with threadpoolctl; this
        # keeps reference computations from oversubscribing the cores meanwhile.
        "OMP_NUM_THREADS": str(max(1, threads)),
        "PYTHONHASHSEED": "0",
        "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING": "1",
    }


__all__ = ["Worker", "worker_env"]
