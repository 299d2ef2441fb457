"""The `xlapy` command line: run, check, format and optimize HLO modules; report their memory.

Every command reads a module from HLO text, StableHLO text (.mlir), StableHLO bytecode
(.mlirbc, portable artifacts) or a serialized jax.export artifact, found by content. Errors
in the user's input (malformed text, an invalid program, inputs that do not match) print the
message and exit with status 1; they never print a traceback.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import click
import numpy as np

from xlapy.backends.options import MEMORY_SCHEDULERS
from xlapy.errors import HloParseError, XlapyError
from xlapy.tools import npz_io
from xlapy.tools.bench import bench


def load_module(path: str, verify: bool = True):
    """Read (and verify) the module in `path`: HLO text, StableHLO text or bytes."""
    from xlapy.ir.verifier import verify as verify_module
    from xlapy.stablehlo import load

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise click.FileError(path, hint=e.strerror) from e
    module = load(data, filename=path)
    if verify:
        verify_module(module)
    return module


def select_inputs(module, inputs: str | None, random_inputs: bool, seed: int) -> list:
    """The entry arguments: read from the --inputs .npz file, or drawn at random."""
    params = [p.shape for p in module.entry.parameters]
    if inputs and random_inputs:
        raise click.UsageError("give either --inputs or --random-inputs, not both")
    if inputs:
        return npz_io.load_inputs(inputs, params)
    if random_inputs or not npz_io.leaf_shapes(params):
        return npz_io.random_inputs(params, seed)
    raise click.UsageError(
        f"{module.name} takes {len(params)} parameters: give --inputs FILE.npz or --random-inputs"
    )


def summarize(name: str, value) -> str:
    """One line describing an output array: shape, a few statistics, the first values."""
    arr = np.asarray(value)
    from xlapy.ir.types import PrimitiveType

    type_name = PrimitiveType.from_dtype(arr.dtype).text
    head = f"{name}: {type_name}[{','.join(map(str, arr.shape))}]"
    if arr.size == 0:
        return head + " (empty)"
    flat = arr.reshape(-1)
    if arr.dtype.kind in "biu" or arr.dtype == np.bool_:
        stats = f" min={flat.min()} max={flat.max()}"
    else:
        wide = flat.astype(np.complex128 if arr.dtype.kind == "c" else np.float64)
        if arr.dtype.kind == "c":
            stats = f" mean={wide.mean():.6g}"
        else:
            stats = f" min={wide.min():.6g} max={wide.max():.6g} mean={wide.mean():.6g}"
    shown = np.array2string(flat[:6], precision=6, separator=", ", threshold=6)
    more = " ..." if flat.size > 6 else ""
    return f"{head}{stats} values={shown}{more}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="xlapy")
@click.option("--traceback", is_flag=True, help="show the Python traceback of an internal error")
def cli(traceback):
    """xlapy: XLA, the machine-learning compiler, written in Python."""


@cli.command()
@click.argument("module_path", metavar="MODULE.hlo", type=click.Path(dir_okay=False))
@click.option("--inputs", type=click.Path(dir_okay=False), help="param_0, param_1, ... arrays")
@click.option("--random-inputs", is_flag=True, help="run on fresh random inputs")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of --random-inputs")
@click.option("--output", type=click.Path(dir_okay=False), help="write output_0, ... here")
@click.option("--backend", default="cpu", show_default=True, help="cpu or interpreter")
@click.option("--verbose", "-v", is_flag=True, help="compile progress and time per pass")
def run(module_path, inputs, random_inputs, seed, output, backend, verbose):
    """Run MODULE.hlo and print a summary of each output."""
    from xlapy.backends import get_backend
    from xlapy.tools.progress import compile_progress

    module = load_module(module_path)
    args = select_inputs(module, inputs, random_inputs, seed)
    start = time.perf_counter()
    with compile_progress(lambda line: click.echo(line, err=True) if verbose else None) as p:
        program = get_backend(backend).compile(module)
    if verbose:
        click.echo(p.summary(), err=True)
    compiled = time.perf_counter()
    result = program.run(args)
    ran = time.perf_counter()
    leaves = npz_io.flatten(result)
    for i, leaf in enumerate(leaves):
        click.echo(summarize(f"output_{i}", leaf))
    click.echo(
        f"{module.name} on {backend}: compiled in {(compiled - start) * 1e3:.2f} ms, "
        f"ran once in {(ran - compiled) * 1e3:.2f} ms (first run; `xlapy bench` for steady "
        "times)",
        err=True,
    )
    if output:
        np.savez(output, **npz_io.output_arrays(result))


@cli.command()
@click.argument("module_path", metavar="MODULE.hlo", type=click.Path(dir_okay=False))
def check(module_path):
    """Parse and verify MODULE.hlo."""
    module = load_module(module_path)
    count = sum(len(c.instructions) for c in module.computations)
    click.echo(
        f"{module_path}: ok ({module.name}: {len(module.computations)} computations, "
        f"{count} instructions)"
    )


@cli.command()
@click.argument("module_path", metavar="MODULE.hlo", type=click.Path(dir_okay=False))
@click.option("--long", "long_form", is_flag=True, help="XLA's long form: %names, signatures")
@click.option("--no-metadata", is_flag=True, help="drop metadata={...}")
def fmt(module_path, long_form, no_metadata):
    """Print MODULE.hlo back in canonical form."""
    from xlapy.ir.printer import PrintOptions, print_module

    module = load_module(module_path, verify=False)
    options = PrintOptions.long() if long_form else PrintOptions.short()
    if no_metadata:
        options = dataclasses.replace(options, metadata=False)
    click.echo(print_module(module, options), nl=False)


@cli.command()
@click.argument("module_path", metavar="MODULE.hlo", type=click.Path(dir_okay=False))
@click.option("--no-opt", is_flag=True, help="skip the default CPU pipeline")
@click.option(
    "--top", type=click.IntRange(min=0), default=10, show_default=True, help="peak buffers to list"
)
@click.option(
    "--scheduler",
    type=click.Choice(list(MEMORY_SCHEDULERS)),
    default="plan",
    show_default=True,
    help="the sequential order buffers are assigned over: the backend option "
    "memory_scheduler (plan: the order whose plan is smallest, what the backends run)",
)
@click.option("--csv", "csv_path", metavar="FILE", help="one row per value to FILE ('-': stdout)")
@click.option(
    "--plot",
    "plot_path",
    metavar="FILE.png",
    type=click.Path(dir_okay=False),
    help="draw the memory timeline",
)
@click.option("--json", "as_json", is_flag=True, help="print the figures as one JSON object")
@click.option(
    "--partition",
    "num_partitions",
    type=click.IntRange(min=1),
    help="SPMD-partition the sharded module for N devices first: the figures are per device",
)
def memory(module_path, no_opt, top, scheduler, csv_path, plot_path, as_json, num_partitions):
    """Report the memory of MODULE.hlo: allocations, stats, peak buffers.

    This is the buffer assignment of the program compiled for the CPU backend (the one it
    executes, and the one `executable.memory_stats()` and JAX's
    `compiled.memory_analysis()` report); with --no-opt, the interpreter's (the module as
    given). --scheduler X reports the plan a compile with the backend option
    memory_scheduler=X runs."""
    from xlapy.memory import report
    from xlapy.runtime import CompileOptions
    from xlapy.runtime.compiler import Compiler

    module = load_module(module_path)
    if num_partitions is not None:
        from xlapy.passes.spmd import partition

        click.echo(partition(module, num_partitions).text(), err=True)
    backend_options = {} if scheduler == "plan" else {"memory_scheduler": scheduler}
    options = CompileOptions.make(backend_options=backend_options)
    executable = Compiler("interpreter" if no_opt else "cpu").compile_canonical(module, options)
    a = executable.memory_plan()  # what a program compiled from `executable` runs over
    if plot_path:
        report.plot_timeline(a, plot_path)
    if csv_path == "-":
        report.write_csv(a, sys.stdout)
    elif csv_path:
        with open(csv_path, "w", newline="") as f:
            report.write_csv(a, f)
    if as_json:
        click.echo(report.figures_json(a, scheduler))
    elif csv_path != "-":
        click.echo(report.format_report(a, top, scheduler))
    if plot_path:
        click.echo(f"wrote the memory timeline to {plot_path}", err=True)


@cli.command()
@click.argument("module_path", metavar="MODULE.hlo", type=click.Path(dir_okay=False))
@click.option(
    "--passes",
    "pass_names",
    metavar="A,B,...",
    help="passes to run in order (default: the default CPU pipeline)",
)
@click.option(
    "--dump-dir",
    type=click.Path(file_okay=False),
    help="write the module after each pass that changed it",
)
@click.option("--no-verify", is_flag=True, help="do not run the verifier between passes")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="write the result here")
@click.option(
    "--partition",
    "num_partitions",
    type=click.IntRange(min=1),
    help="SPMD-partition the sharded module for N devices first (then only the --passes "
    "given run); the report of ops that fell back to replication goes to stderr",
)
@click.option(
    "--backend",
    type=click.Choice(["cpu"]),
    help="also compile the result for this backend and list, on stderr, every instruction "
    "it runs with the interpreter's rule (its fallbacks) and every while loop it drives "
    "from Python instead of as one native function, each with why",
)
def opt(module_path, pass_names, dump_dir, no_verify, output, num_partitions, backend):
    """Optimize MODULE.hlo and print the result."""
    from xlapy.passes.pipelines import CPU_PIPELINE, build

    plan = CPU_PIPELINE
    if pass_names is not None:
        plan = [n.strip() for n in pass_names.split(",") if n.strip()]
        if not plan:
            raise click.UsageError("--passes names no pass")
    pipeline = build("opt", plan, dump_dir=dump_dir, verify=not no_verify)
    module = load_module(module_path)
    if num_partitions is not None:
        from xlapy.passes.spmd import partition

        click.echo(partition(module, num_partitions).text(), err=True)
        if pass_names is None:  # the partitioned module, unoptimized unless --passes
            pipeline = build("opt", [], dump_dir=dump_dir, verify=not no_verify)
    start = time.perf_counter()
    pipeline.run(module)
    elapsed = time.perf_counter() - start
    text = module.to_text()
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=not text.endswith("\n"))
    changed = sorted({name for name, did in pipeline.log if did})
    click.echo(
        f"ran {len(pipeline.log)} passes in {elapsed * 1e3:.1f} ms; changed by: "
        f"{', '.join(changed) or 'none'}",
        err=True,
    )
    if backend is not None:
        from xlapy.backends import get_backend

        program = get_backend(backend).compile(module, text=text)
        fallbacks = program.fallbacks
        click.echo(f"{backend} fallbacks: {len(fallbacks) or 'none'}", err=True)
        for f in fallbacks:
            click.echo(f"  {f}", err=True)
        loops = program.python_loops
        if loops:
            click.echo(f"{backend} while loops driven from Python: {len(loops)}", err=True)
            for f in loops:
                click.echo(f"  {f}", err=True)


cli.add_command(bench)


def main(argv=None) -> int:
    """Entry point: run the CLI, turning xlapy errors into a message and exit status 1."""
    try:
        cli.main(args=argv, prog_name="xlapy", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except HloParseError as e:
        click.echo(str(e), err=True)  # already `file:line:col: error: ...` with a caret
        return 1
    except XlapyError as e:
        click.echo(f"xlapy: error: {e}", err=True)
        return 1
    except RecursionError:
        click.echo("xlapy: error: the program is nested too deeply to process", err=True)
        return 1
    except Exception as e:  # a bug in xlapy, not in the input: one line, traceback on request
        args = sys.argv[1:] if argv is None else argv
        if "--traceback" in args[: args.index("--") if "--" in args else len(args)]:
            raise
        message = " ".join(str(e).split())[:300]
        click.echo(
            f"xlapy: internal error: {type(e).__name__}: {message} (this is a bug in xlapy; "
            "run 'xlapy --traceback ...' to see where)",
            err=True,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
