"""What generated kernels import at run time: LLVM-vector intrinsics (``simd``) and the vector
forms of epilogue ops (``elementwise``). Their source is part of every kernel's cache address.

Importing it installs ``lazy_codegen`` (one LLVM optimisation and machine-code emission per
compiled entry point instead of one per Numba function): every process that compiles a
generated kernel imports this package first."""
from search_spaces.runtime import lazy_codegen

lazy_codegen.install()
