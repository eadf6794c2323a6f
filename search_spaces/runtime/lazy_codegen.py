"""Compile each kernel's machine code once: Numba code libraries whose module optimisation and
machine code wait until something needs them (docs/compile-once.md, "One optimisation per
module").

Numba compiles every jitted function into its own code library and, when the library is
finalized, runs LLVM's full module optimisation over it and emits its machine code. A caller's
library *links in* the IR of every callee's library and optimises and emits all of it again.
A generated conv2d module is a chain: ``gemm_core_block`` (the block loops and the inlined
micro-kernel), the three libraries of ``gemm_core``'s parallel loop (gufunc body, gufunc
wrapper, parallel wrapper), ``gemm_core``, then ``kernel_prepared``: the largest code of the
module was optimised and turned into machine code six times, though only the last copy
(``kernel_prepared``'s, the one Numba's cache stores) ever runs. Measured on one such module
(AMD Zen 4, numba 0.68.1, ``NUMBA_LLVM_PASS_TIMINGS``): 2.6 s of its 6.4 s compile in those
repeated optimisations and emissions.

``LazyJITCodeLibrary`` defers the module optimisation and the machine code of a library until
its machine code is asked for: a function pointer of a symbol the library defines (a function
with a Python wrapper: every function called from Python), its object code (Numba's cache),
its assembly or optimised IR (inspection). A library asked only for linking (a function
compiled with ``no_cpython_wrapper``, a parallel loop's gufunc) gives its function-optimised
IR, and the caller optimises everything once. What runs is the same code the eager chain
gave: the caller's module optimisation sees the same functions, inlines as before, and
vectorises the same loops (the kernel speeds measured against the eager chain are in the
docs).

A function compiled before being called from Python (the build worker compiles ``kernel``,
then a test calls ``prepare``) has a wrapper, so it was completed at its compile: nothing
changes for it. The one thing that moves is the *environment* pointer Numba stores in each
function's module (``set_env`` at compile time): a deferred library has no loaded module to
store it in yet, so the store waits until a module defining that global is loaded (its own
completion or a caller's). Nopython code reads its environment only to raise an exception
with a Python object, which generated kernels do not.

``install()`` makes the CPU target create these libraries (idempotent), ``uninstall()`` gives
Numba's own eager libraries back for what compiles next. ``tuner.measure.kernel_key``'s
``import_kernel_module``, which loads every generated module in every process, applies
``tuner.settings.lazy_codegen()`` first (``TUNER_LAZY_CODEGEN=0``: eager, for A/B comparisons).
"""
from __future__ import annotations

import functools

_pending_envs: dict[str, object] = {}

# What asks a library for its machine code or optimised module besides a function pointer:
# its object code (Numba's cache), bitcode, optimised IR, assembly and control-flow graphs.
COMPLETING = ("_get_compiled_object", "serialize_using_bitcode", "get_llvm_str", "get_asm_str",
              "get_function_cfg", "get_disasm_cfg")


def _completing(method):
    """``method`` of Numba's library, run after the deferred optimisation and machine code."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        self._complete()
        return method(self, *args, **kwargs)
    return wrapper


def _make_class():
    from numba.core.codegen import JITCodeLibrary
    from numba.core.compiler_lock import global_compiler_lock

    class LazyJITCodeLibrary(JITCodeLibrary):
        """A JIT code library whose full module optimisation and machine code are deferred
        until they are needed (module docstring)."""

        _deferred = False

        def _optimize_final_module(self):
            # finalize(): functions optimised, callees linked in; the module pass waits
            self._deferred = True

        def _finalize_final_module(self):
            if self._deferred:
                self._finalized = True   # linkable now; machine code when asked
                return
            super()._finalize_final_module()

        def _complete(self):
            """The module optimisation and machine code a finalized library deferred (under
            Numba's compiler lock, as its own finalize runs; the lock is reentrant)."""
            with global_compiler_lock:
                self._ensure_finalized()
                if not self._deferred:
                    return
                self._deferred = False
                super()._optimize_final_module()
                self._final_module.verify()
                super()._finalize_final_module()
                if _pending_envs:
                    _store_pending_envs(self._codegen, self._final_module)

        def _defines(self, name: str) -> bool:
            try:
                return not self._final_module.get_function(name).is_declaration
            except NameError:
                try:
                    return not self._final_module.get_global_variable(name).is_declaration
                except NameError:
                    return False

        def get_pointer_to_function(self, name):
            self._ensure_finalized()
            if self._deferred:
                if not self._defines(name):
                    return 0   # as an eager library answers for a symbol it lacks
                self._complete()
            return super().get_pointer_to_function(name)

    for name in COMPLETING:   # each completes the library first, then is Numba's own
        setattr(LazyJITCodeLibrary, name, _completing(getattr(JITCodeLibrary, name)))
    return LazyJITCodeLibrary


def _store_pending_envs(codegen, module) -> None:
    """Store each waiting environment whose global the module just loaded defines."""
    from numba.core.codegen import JITCPUCodegen

    for gv in module.global_variables:
        if gv.name in _pending_envs and not gv.is_declaration \
                and codegen._engine.get_global_value_address(gv.name):
            JITCPUCodegen._eager_set_env(codegen, gv.name, _pending_envs.pop(gv.name))


def _set_env(self, env_name, env):
    """``JITCPUCodegen.set_env`` that waits for the environment's global to be loaded."""
    if self._engine.get_global_value_address(env_name):
        type(self)._eager_set_env(self, env_name, env)
    else:
        _pending_envs[env_name] = env


def install() -> bool:
    """Make Numba's CPU JIT target create lazy code libraries; False where this Numba lacks
    the internals it replaces (then Numba's own libraries stay)."""
    try:
        from numba.core.codegen import JITCodeLibrary, JITCPUCodegen
    except ImportError:
        return False
    if getattr(JITCPUCodegen, "_lazy_class", None) is not None:
        JITCPUCodegen._library_class = JITCPUCodegen._lazy_class
        return True
    needed = ("_optimize_final_module", "_finalize_final_module", "get_pointer_to_function",
              *COMPLETING)
    if JITCPUCodegen._library_class is not JITCodeLibrary or not all(
            hasattr(JITCodeLibrary, n) for n in needed):
        return False
    JITCPUCodegen._eager_set_env = JITCPUCodegen.set_env
    JITCPUCodegen.set_env = _set_env   # stores at once wherever the global is loaded
    JITCPUCodegen._lazy_class = JITCPUCodegen._library_class = _make_class()
    return True


def uninstall() -> None:
    """Numba's eager libraries for every compile from now on (deferred ones complete as
    before when asked)."""
    from numba.core.codegen import JITCodeLibrary, JITCPUCodegen

    JITCPUCodegen._library_class = JITCodeLibrary


def installed() -> bool:
    from numba.core.codegen import JITCPUCodegen

    return JITCPUCodegen._library_class is getattr(JITCPUCodegen, "_lazy_class", None)
