"""The blocked-GEMM engine the gemm, gemm_int8, dense and conv2d templates generate their kernels with.

- ``space``: the knobs, constraints and repair of every template on the engine (tile and
  micro-tile value lists from the ISA, the register budget, tiles against the micro-tile,
  the one repair rule, the dense/conv2d core's knob set and default);
- ``microkernels``: the K loop and register-tile step every micro-kernel is generated with
  (``k_loop``, ``register_tile_step``: float FMA, int8 dot products), the vector tile store,
  and the GEMM template's micro-kernel styles (plain loops, unrolled scalars, LLVM vectors)
  and edge kernel;
- ``packing``: the panel packers (MR-row A panels, NR-column B panels with vector copies,
  ``kc`` steps deep), the implicit im2col copies and the 64-byte-aligned packing buffers,
  for the GEMM template and the dense/conv2d core alike;
- ``blocked``: ``emit_block_loops`` / ``emit_packed_block_loops``, the block loops every
  GEMM-shaped kernel shares, and the GEMM template's module (C written in place, tiles as
  kernel arguments);
- ``core``: the implicit-GEMM core of dense and conv2d (operands from images, a scratch tile
  per micro-kernel call, fused epilogue per tile, shape-generic modules);
- ``int8_microkernels``: the int8 GEMM's K-group packing and dot-product micro-kernel;
- ``rowaxpy``: the GEMV formulation (M < 8: B streamed by rows into L1-resident rows of C).
"""
