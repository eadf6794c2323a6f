"""``python -m tuner show gemm --shape S [--config JSON | --best]``: print generated source."""
from __future__ import annotations

from tuner.cli.common import (add_db_arg, add_threads_arg, add_workload_args, open_store,
                              threads_of, workload_of)


def register(sub) -> None:
    p = sub.add_parser("show", help="print the generated kernel source for a config (or the space)")
    add_workload_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--config", help="config as JSON (default: the template's default config)")
    g.add_argument("--best", action="store_true", help="the best recorded config for this target")
    g.add_argument("--space", action="store_true", help="list the knobs and the space size instead")
    p.add_argument("--template", default=None)
    add_threads_arg(p)
    add_db_arg(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from search_spaces import template_for
    from search_spaces.space import Config

    workload = workload_of(args)
    threads = threads_of(args)
    template = template_for(workload, args.template)
    space = template.space(workload, threads)
    if args.space:
        print(f"# {template.name} v{template.version} for {workload}, {threads} thread(s)")
        for k in space.knobs:
            kind = "ordinal" if k.ordinal else "categorical"
            print(f"{k.name:14s} {kind:11s} {list(k.values)}")
        for c in space.constraints:
            print(f"constraint: {c.name}")
        print(f"points: {space.size}, valid: {space.valid_text()}")
        return 0
    if args.best:
        from tuner.dispatch import select_config

        sel = select_config(workload, template, open_store(args), threads=threads)
        config = sel.config
        print(f"# {sel.source} config: {config.to_json()}")
    elif args.config:
        config = space.validate(Config.from_json(args.config))
    else:
        config = template.default_config(workload, threads)
        print(f"# default config: {config.to_json()}")
    from search_spaces.template import kernel_source, prepared_inputs

    print(kernel_source(template, workload, config))

    prepared = prepared_inputs(template, workload, config)
    if prepared:   # constant operands packed once (search_spaces/template.py)
        n_in = len(workload.input_specs())
        kept = [f"x{i}" for i in range(n_in) if i not in prepared]
        print(f"# prepared once: prepare({', '.join(f'x{i}' for i in prepared)}) when those inputs are "
              "constants (a built model: at build time), then every call is "
              f"kernel_prepared({', '.join(kept + ['*prepared', 'out'])}); otherwise "
              f"{template.entry}(x0..x{n_in - 1}, out) prepares on each call")
    runtime = template.runtime_args(workload, config)
    if runtime:   # knobs passed as arguments: the source is shared by every value of them
        n_arrays = len(workload.input_specs()) + len(workload.output_specs())
        arrays = "A, B, C" if n_arrays == 3 else ", ".join(f"x{i}" for i in range(n_arrays))
        names = template.runtime_arg_names(workload, config)
        call = ", ".join(f"{k}={v}" for k, v in zip(names, runtime))
        print(f"# called as: {template.entry}({arrays}, {call})")
    return 0
