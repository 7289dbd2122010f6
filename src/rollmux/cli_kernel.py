"""``rollmux kernel``: build the compiled analysis kernel and say which one runs."""
from __future__ import annotations

import typer
from rich.markup import escape

from rollmux import native
from rollmux.cli_output import console

kernel_app = typer.Typer(no_args_is_help=True, help=(
    "The planner's analysis kernel (rollmux.kernel), compiled with mypyc where a C compiler is at hand. "
    "`make install` builds it; the source runs wherever it is not built or was edited since."))


@kernel_app.command("build")
def build() -> None:
    """Compile the kernel with mypyc, then its simulation loop in C (about fifteen seconds; needs mypy, from the
    `native` extra, and a C compiler). Exits 1, and the source keeps running, when the build fails."""
    try:
        shim = native.build()
    except (native.BuildError, OSError) as exc:
        console.print(f"[red]no compiled kernel[/red]: the source runs. {escape(str(exc))}")
        raise typer.Exit(1)
    console.print(f"built {escape(str(shim))}; new processes import it while kernel.py is unchanged")


@kernel_app.command("status")
def status() -> None:
    """Which kernel this process imports, compiled or pure Python, and why."""
    console.print(f"rollmux.kernel: {escape(native.status())}", highlight=False)
    console.print(f"simulation loop: {escape(native.simulator_status())}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``kernel`` command group to ``app``."""
    app.add_typer(kernel_app, name="kernel")
