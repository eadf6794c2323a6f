"""tuner.bench.compile_profile: per-function compile times from Numba's compile events."""
from __future__ import annotations

import numba
import pytest
from numba.core import event

from tuner.bench.compile_profile import FunctionTimes, main


def test_exclusive_times_leave_out_callees():
    """A callee compiles during its caller's type inference: the caller's exclusive time is
    its inclusive time less the callee's, and both are counted once."""
    @numba.njit
    def inner(x):
        return x * 2 + 1

    @numba.njit
    def outer(x):
        s = 0
        for i in range(x):
            s += inner(i)
        return s

    ft = FunctionTimes()
    lst = ft.listener()
    event.register("numba:compile", lst)
    try:
        assert outer(4) == 16
    finally:
        event.unregister("numba:compile", lst)
    assert ft.calls == {"outer": 1, "inner": 1}
    assert ft.children["outer"] > 0 and ft.children["outer"] >= ft.exclusive["inner"]
    assert ft.children["inner"] == 0 and ft.exclusive["inner"] > 0 and ft.exclusive["outer"] > 0
    assert not ft.stack


def test_missing_model_is_a_usage_error(tmp_path, capsys):
    assert main([str(tmp_path / "none.onnx")]) == 2
    assert "no such model file" in capsys.readouterr().err
