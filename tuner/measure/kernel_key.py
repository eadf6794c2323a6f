"""The content address of a generated kernel: everything its machine code depends on.

A generated module imports project helpers at run time (``search_spaces.runtime.simd``'s vector
intrinsics, ``search_spaces.epilogue``...), and Numba's on-disk cache keys a function by its
own file only: it does not notice that a helper it inlined has changed, nor (within one index
entry) a Numba or llvmlite upgrade of the code generator. So the address of a kernel file,
``k_<digest>.py``, hashes

- the kernel source,
- the source of every project module it imports, transitively (packages ``search_spaces``,
  ``tuner`` and ``workloads``; a package's ``__init__`` counts, since importing a submodule
  runs it). Imports that run when a module is imported count (module and class bodies,
  ``if``/``try`` blocks); imports inside function bodies do not: followed, they pulled in
  the whole project (``search_spaces.__init__`` -> ``tuner.dispatch`` -> ...), so that any
  edit anywhere would recompile every kernel,
- the numba and llvmlite versions, and the template's name and version.

A changed helper or an upgrade gives a new file name, so Numba compiles it anew instead of
loading machine code built from the old helper. Module digests are memoised per process by
(path, mtime, size), so addressing a kernel costs a few ``stat`` calls.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
from functools import lru_cache

from tuner import settings

PROJECT_PACKAGES = ("search_spaces", "tuner", "workloads")


def _is_project(name: str) -> bool:
    return name.split(".")[0] in PROJECT_PACKAGES


def _origin(name: str) -> str | None:
    """File of module ``name`` as this process would import it (None: not a module/no file)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Project modules named by the import statements of ``tree`` (module ``module``):
    ``import a.b`` gives a and a.b; ``from a import b`` gives a and, when it is a module,
    a.b; relative imports are resolved against ``module``'s package."""
    out: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in _import_time_nodes(tree):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            subs: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                root = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{root}.{node.module}" if node.module else root
            else:
                base = node.module or ""
            bases = [base]
            subs = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        else:
            continue
        for name in bases + subs:
            if not name or not _is_project(name):
                continue
            parts = name.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def _import_time_nodes(tree: ast.AST):
    """Every node executed when the module is imported: all but function (and lambda) bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)


@lru_cache(maxsize=None)
def _module_digest(path: str, mtime_ns: int, size: int) -> tuple[str, str]:
    """(sha1 of the file, its source) for one version of one file."""
    with open(path, "rb") as fh:
        data = fh.read()
    return hashlib.sha1(data).hexdigest(), data.decode("utf-8", "replace")


def module_source(name: str) -> tuple[str, str] | None:
    """(digest, source) of project module ``name``, or None when it has no source file."""
    path = _origin(name)
    if path is None:
        return None
    st = os.stat(path)
    return _module_digest(path, st.st_mtime_ns, st.st_size)


def project_closure(source: str) -> dict[str, str]:
    """Module name -> sha1 of its source, for every project module ``source`` imports,
    transitively."""
    try:
        todo = sorted(_imported_names(ast.parse(source), "__kernel__", False))
    except SyntaxError:
        return {}                  # it will not build; its own text is address enough
    seen: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        found = module_source(name)
        if found is None:
            seen[name] = "-"       # a name imported from a module, not a module itself
            continue
        digest, text = found
        seen[name] = digest
        is_pkg = (_origin(name) or "").endswith("__init__.py")
        todo += sorted(_module_imports(name, digest, is_pkg, text) - set(seen))
    return {k: v for k, v in sorted(seen.items()) if v != "-"}


@lru_cache(maxsize=None)
def _module_imports(name: str, digest: str, is_pkg: bool, text: str) -> frozenset[str]:
    """The project modules one version (``digest``) of module ``name`` imports: parsed once
    per process, not once per kernel (a build of ResNet-50 parsed ~600 module sources)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return frozenset()         # hashed all the same; the import will fail loudly
    return frozenset(_imported_names(tree, name, is_pkg))


def toolchain_versions() -> dict[str, str]:
    import llvmlite
    import numba

    return {"numba": numba.__version__, "llvmlite": llvmlite.__version__}


def kernel_digest(source: str, template: str = "") -> str:
    """sha1 over the kernel source, its project import closure, the numba/llvmlite versions
    and ``template`` (``"name/version"``): the kernel file's content address."""
    h = hashlib.sha1()
    for part in (source, template, *(f"{k}={v}" for k, v in toolchain_versions().items()),
                 *(f"{k}:{v}" for k, v in project_closure(source).items())):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def import_kernel_module(path) -> object:
    """The generated module at ``path`` (a ``k_<digest>.py`` file), imported once per process
    under the name every loader uses, ``tuner_kernel_k_<digest>``: Numba's cache locates a
    function's machine code by its module, so the module must be registered in
    ``sys.modules`` under a stable name before it runs."""
    import sys

    name = "tuner_kernel_" + os.path.basename(str(path))[:-3]
    mod = sys.modules.get(name)
    if mod is None:
        settings.apply_codegen()   # before its functions compile
        spec = importlib.util.spec_from_file_location(name, str(path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return mod
