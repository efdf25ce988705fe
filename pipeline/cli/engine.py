"""``simpipe engine``: which embedded llama.cpp build is installed, and building one for this
CPU (``simpipe.inference.llamacpp.native_build``; imported inside each command so that
``simpipe --help`` stays light)."""

from __future__ import annotations

import os

import click


@click.group("engine")
def engine_group() -> None:
    """The embedded llama.cpp engine: show its build, or compile it for this CPU."""


@engine_group.command("show")
def engine_show() -> None:
    """Print the installed engine's build and the instruction sets this CPU has that it
    leaves unused."""
    from simpipe.inference.llamacpp.native_build import (
        check_cpu,
        cpu_flags,
        installed_engine,
        unused_instruction_sets,
    )

    build = installed_engine()
    click.echo(f"engine: {build.describe()}")
    flags = cpu_flags()
    check_cpu(build, flags, "this machine")
    unused = unused_instruction_sets(build, flags)
    if unused:
        click.echo(f"this CPU also has {', '.join(unused)}: `simpipe engine build` compiles "
                   "the engine for it (minutes; on the machine docs/benchmarks.md measured, "
                   "runs with shared answers took about 0.8 of the time, and calls of one agent "
                   "each 1.7 times as long: that build has no llguidance)")
    elif flags is not None:
        click.echo("the engine uses every instruction set of this CPU that llama.cpp can")


@engine_group.command("build")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compile jobs [default: this machine's cores].")
@click.option("--prebuilt", is_flag=True,
              help="Put PyPI's prebuilt wheel back instead (runs on any CPU with AVX2).")
def engine_build(jobs: int | None, prebuilt: bool) -> None:
    """Compile the pinned llama.cpp engine (xllamacpp) from source for this CPU and install it
    into this Python environment. Needs cmake, a C++ compiler and Python's headers; about 6
    minutes on two cores. Workers on other machines need CPUs with the same instruction sets
    (a run on one that lacks them stops with the fix)."""
    from simpipe.inference.llamacpp.native_build import build_for_this_cpu, install_prebuilt

    def say(line: str) -> None:
        click.echo(line)

    if prebuilt:
        build = install_prebuilt(say)
    else:
        build = build_for_this_cpu(jobs or os.cpu_count() or 1, say)
    click.echo(f"engine: {build.describe()}")
