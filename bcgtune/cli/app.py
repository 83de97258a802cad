"""The typer app. Each command lives in its own module under bcgtune/cli/ and imports its
heavy dependencies (numpy-heavy core, scikit-learn, torch, sglang) inside the function, so
`bcgtune --help` stays fast and free of torch / sglang / scikit-learn."""

from __future__ import annotations

import sys

import typer

from bcgtune import __version__
from bcgtune.errors import BcgError

app = typer.Typer(
    name="bcgtune",
    help="Tune and check the prefill CUDA graphs of an LLM server (SGLang breakable prefill graphs).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bcgtune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    pass


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
        # Non-standalone typer turns Ctrl-C into a returned 130 instead of raising.
        if rv == 130:
            typer.echo("error: interrupted", err=True)
            sys.exit(130)
    except BcgError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


# Imported for their @app.command side effects; each module is light at import time.
from bcgtune.cli import suggest, trace_cmd  # noqa: E402,F401
from bcgtune.cli import doctor, serve  # noqa: E402,F401
from bcgtune.cli import gpu  # noqa: E402,F401
from bcgtune.cli import bench  # noqa: E402,F401
