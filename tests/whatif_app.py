"""The ``whatif`` command on a Typer app of its own, as the whatif tests run it."""
from __future__ import annotations

import typer

from rollmux.cli_whatif import register


def whatif_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _main() -> None:
        pass

    register(app)
    return app
