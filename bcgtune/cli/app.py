"""The command line: every command is registered here, in the order `bcgtune --help` lists
them, and `main()` is the one boundary between the library and the user.

At the boundary every outcome becomes one line on stderr and a documented exit code
(bcgtune/errors.py): usage errors print the parser's own message (exit 2), library errors
their `what (where)` with a domain field turned into the flag that carried it, Ctrl-C and
SIGTERM exit 130, and an unexpected exception prints one line saying how to see its
traceback (`bcgtune --debug ...` or BCGTUNE_DEBUG=1), exit 4. It works the same on every
typer version pyproject.toml allows: click's exception classes are found through typer's
own BadParameter, whichever click (bundled or not) the installed typer uses.

Command modules never import this one (no import cycle); heavy libraries (torch, sglang,
scikit-learn, matplotlib) are imported only inside the functions that need them.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

import typer

from bcgtune import __version__
from bcgtune.cli.commands import bench, doctor, drift, engine, serve, suggest, trace
from bcgtune.cli.console import StdoutClosed, err_line
from bcgtune.cli.options import resolved_callable
from bcgtune.errors import BcgError, InputError, Interrupted

DEBUG_ENV = "BCGTUNE_DEBUG"
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130

# (name, function): the order of `bcgtune --help`.
COMMANDS: list[tuple[str, Callable]] = [
    ("trace", trace.trace_command),
    ("suggest-buckets", suggest.suggest_buckets_command),
    ("drift", drift.drift_command),
    ("capture", engine.capture_command),
    ("validate", engine.validate_command),
    ("calibrate", engine.calibrate_command),
    ("serve", serve.serve_command),
    ("doctor", doctor.doctor_command),
    ("bench", bench.bench_command),
]
# Commands that pass everything after `--` through to another program.
PASSTHROUGH = {"trace", "serve", "bench"}

_state: dict[str, Any] = {"command": None, "debug": False}


def _guard(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Runs a command: turns what typer would otherwise swallow or reword (Ctrl-C, EOF, a
    closed stdout) into bcgtune's own exceptions, which typer passes through untouched."""
    try:
        return func(*args, **kwargs)
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None
    except EOFError:
        raise InputError("unexpected end of input (standard input closed?)") from None
    except BrokenPipeError:
        raise StdoutClosed() from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bcgtune {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="bcgtune",
        help="Tune and check the prefill CUDA graphs of an LLM server (SGLang breakable prefill graphs).",
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )

    @app.callback()
    def _root(
        ctx: typer.Context,
        version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
        debug: bool = typer.Option(False, "--debug", help=f"Show the traceback of an unexpected error (also {DEBUG_ENV}=1)."),
    ) -> None:
        _state["command"] = ctx.invoked_subcommand
        _state["debug"] = _state["debug"] or debug

    for name, func in COMMANDS:
        settings = {"allow_interspersed_args": False} if name in PASSTHROUGH else {}
        app.command(name, context_settings=settings)(resolved_callable(func, _guard))
    return app


app = build_app()


def _click_classes() -> tuple[type, ...]:
    """(ClickException, Abort, Exit) of the click the installed typer runs on."""
    click_exc = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return click_exc, typer.Abort, typer.Exit


def _flag_for(field: str | None) -> str | None:
    """The flag of the running command whose parameter is named `field` (the library names
    its inputs in domain terms; the parameter names match them)."""
    if not field:
        return None
    name = _state.get("command")
    cmd = None
    try:
        group = typer.main.get_command(app)
        cmd = group.commands.get(name) if name else None  # type: ignore[attr-defined]
    except Exception:
        cmd = None
    if cmd is not None:
        for p in cmd.params:
            tail = p.name.split("__")[-1] if p.name else ""
            if tail == field and getattr(p, "opts", None):
                longs = [o for o in p.opts if o.startswith("--")]
                return (longs or p.opts)[0]
    return None


def _message(exc: BcgError) -> str:
    if exc.field and not exc.where:
        flag = _flag_for(exc.field)
        if flag:
            return f"{exc.what} ({flag})"
    return str(exc)


def run(argv: list[str]) -> int:
    """Run one command line; return its exit code (never raises, except SystemExit from a
    command that owns the process, e.g. serve)."""
    click_exc, abort, typer_exit = _click_classes()
    _state["command"] = None
    _state["debug"] = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if not argv:
        argv = ["--help"]
    try:
        rv = app(args=argv, prog_name="bcgtune", standalone_mode=False)
        if isinstance(rv, int) and rv == EXIT_INTERRUPTED:
            err_line("error: interrupted")
        return rv if isinstance(rv, int) else 0
    except BcgError as exc:
        err_line(f"error: {_message(exc)}")
        return exc.exit_code
    except StdoutClosed:
        return 0
    except click_exc as exc:
        msg = " ".join(str(exc.format_message()).split())
        cmd = _state.get("command")
        hint = f" (bcgtune {cmd} --help)" if cmd else " (bcgtune --help)"
        err_line(f"error: {msg or 'bad usage'}{hint}")
        return 2
    except typer_exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except abort as exc:
        if isinstance(exc.__cause__ or exc.__context__, EOFError):
            err_line("error: unexpected end of input (standard input closed?)")
            return 2
        err_line("error: interrupted")
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        err_line("error: interrupted")
        return EXIT_INTERRUPTED
    except MemoryError:
        err_line("error: out of memory (the input or an option asked for more than this machine has)")
        return 3
    except SystemExit:
        raise
    except Exception as exc:
        if _state["debug"]:
            raise
        what = " ".join(str(exc).split())[:160]
        err_line(
            f"error: internal error: {type(exc).__name__}{': ' + what if what else ''} "
            f"(a bug in bcgtune; rerun with `bcgtune --debug ...` or {DEBUG_ENV}=1 to see the traceback)"
        )
        return EXIT_INTERNAL


def _sigterm(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exits with the command's code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        old = signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # not the main thread (in-process tests)
        old = None
    try:
        code = run(args)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
    sys.exit(code)
