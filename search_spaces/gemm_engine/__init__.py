"""The blocked-GEMM engine the GEMM, dense and conv2d templates generate their kernels with.

- ``blocked``: the GEMM template's kernel (block loops in any order, packing, macro-kernel) and
  ``emit_block_loops``, the block-loop emitter every GEMM-shaped kernel shares;
- ``microkernels``: the register-tile micro-kernels (plain loops, unrolled scalars, LLVM vectors);
- ``rowaxpy``: the GEMV formulation (M < 8: B streamed by rows into L1-resident rows of C);
- ``core``: the implicit-GEMM core of dense and conv2d (packing from images, fused epilogue per tile);
- ``packing``: vector packing and im2col copies of that core.
"""
