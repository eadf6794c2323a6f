import numpy as np
import pytest

import workloads
from workloads.errors import UsageError
from workloads.gemm import Gemm


@pytest.mark.parametrize("shape", ["1024x", "0x5x5", "axbxc", "-3x4x5", "", "1x2", "1x2x3x4",
                                   "4x4x0", "2x2x2.5", "99999999x1x1"])
def test_bad_shapes_are_one_line_usage_errors(shape):
    with pytest.raises(UsageError) as e:
        Gemm.parse(shape)
    assert "\n" not in str(e.value)


def test_shape_too_large_for_memory():
    with pytest.raises(UsageError, match="GiB"):
        Gemm.parse("200000x200000x200000")


def test_key_flops_and_round_trip():
    w = Gemm.parse("128x64x32", "float64")
    assert w.flops() == 2 * 128 * 64 * 32
    assert w.key == 'gemm:{"K":32,"M":128,"N":64,"dtype":"float64"}'
    assert workloads.from_key(w.key) == w
    assert w.input_specs() == [((128, 32), "float64"), ((32, 64), "float64")]


def test_unknown_kind_and_dtype():
    with pytest.raises(UsageError, match="known: .*gemm"):
        workloads.workload_class("conv9d")
    with pytest.raises(UsageError, match="dtype"):
        Gemm.parse("4x4x4", "float16")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_check_accepts_float_rounding_and_catches_errors(dtype):
    w = Gemm.parse("48x40x300", dtype)
    ins = w.make_inputs()
    ref = w.reference(ins)
    # A correct result computed in the working precision, in another summation order, passes.
    a, b = ins
    c = np.zeros((48, 40), dtype=dtype)
    for k0 in range(0, 300, 7):
        c += a[:, k0:k0 + 7] @ b[k0:k0 + 7, :]
    assert w.check(ins, [c], ref) is None
    # One element off by a tiny but real amount (a dropped product term) is caught.
    bad = c.copy()
    bad[3, 5] -= a[3, 17] * b[17, 5]
    assert "outside tolerance" in w.check(ins, [bad], ref)
    nan = c.copy()
    nan[0, 0] = np.nan
    assert "NaN" in w.check(ins, [nan], ref)


def test_int32_is_exact():
    w = Gemm.parse("8x8x8", "int32")
    ins = w.make_inputs()
    ref = w.reference(ins)
    c = (ins[0].astype(np.int64) @ ins[1]).astype(np.int32)
    assert w.check(ins, [c], ref) is None
    c[1, 1] += 1
    assert "differ" in w.check(ins, [c], ref)
