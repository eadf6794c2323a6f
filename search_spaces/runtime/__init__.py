"""What generated kernels import at run time: LLVM-vector intrinsics (``simd``) and the vector
forms of epilogue ops (``elementwise``). Their source is part of every kernel's cache address.
``lazy_codegen`` is how their Numba libraries compile (installed by the kernel loader)."""
