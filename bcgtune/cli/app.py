"""The command line: every command is listed here, in the order `bcgtune --help` lists them,
and `main()` is the one boundary between the library and the user.

At the boundary every outcome becomes one line on stderr and a documented exit code
(bcgtune/errors.py): usage errors print the parser's own message (exit 2), library errors
their `what (where)` with a domain field turned into the flag that carried it, a full disk
or a failing device exit 3, Ctrl-C and SIGTERM exit 130 (at any moment, start-up imports
included), and an unexpected exception prints one line saying how to see its traceback
(`bcgtune --debug ...` or BCGTUNE_DEBUG=1), exit 4. It works the same on every typer version
pyproject.toml allows: click's exception classes are found through typer's own BadParameter,
whichever click (bundled or not) the installed typer uses.

This module imports only the standard library at load: typer and a command's module are
imported when a command line is run, inside the boundary, and only the module of the command
being run (or asked for its help). Command modules never import this one.
"""

import errno
import os
import signal
import sys
from typing import Any, Callable, NamedTuple

from bcgtune import __version__
from bcgtune.cli.console import StdoutClosed, err_line
from bcgtune.procenv import ONE_BLAS_THREAD_COMMANDS, one_blas_thread

DEBUG_ENV = "BCGTUNE_DEBUG"
EXIT_EXTERNAL = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
# An OSError with one of these is the disk or a device failing, not bcgtune.
_DEVICE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


class CommandEntry(NamedTuple):
    name: str
    module: str  # in bcgtune.cli.commands
    function: str
    summary: str  # the first line of the function's docstring (a test keeps them equal)


# The order of `bcgtune --help`.
COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry(
        "trace", "trace", "trace_command", "Record a workload's prefill sizes: from server logs, a simulation, or a live run."
    ),
    # typed `bcgtune trace merge` (see _run)
    CommandEntry(
        "trace merge",
        "trace_merge",
        "trace_merge_command",
        "Merge traces into one, sources, statistics and server configurations kept.",
    ),
    CommandEntry(
        "suggest-buckets",
        "suggest",
        "suggest_buckets_command",
        "The optimal bucket list for a trace, compared with SGLang's default ladder and yours.",
    ),
    CommandEntry(
        "drift", "drift", "drift_command", "Are the deployed bucket lists still right for today's traffic? Exit 1: re-tune."
    ),
    CommandEntry(
        "capture", "engine", "capture_command", "Capture one prefill graph per bucket on the GPU: seconds, memory, errors."
    ),
    CommandEntry(
        "validate",
        "engine",
        "validate_command",
        "Check padded graph replay against eager, bucket by bucket. Exit 1 on a failure.",
    ),
    CommandEntry(
        "calibrate",
        "engine",
        "calibrate_command",
        "Measure eager time, replay time and graph memory: a calibration for the time objective.",
    ),
    CommandEntry(
        "tune", "tune", "tune_command", "Tune on the GPU in one command: calibrate, optimize, measure, validate, prove."
    ),
    CommandEntry(
        "serve", "serve", "serve_command", "Launch an SGLang server from a profile, flags checked against SGLang's parser."
    ),
    CommandEntry(
        "doctor", "doctor", "doctor_command", "Check the installed SGLang and a profile for prefill CUDA-graph problems."
    ),
    CommandEntry("bench", "bench", "bench_command", "A/B benchmark of bucket lists on a live server, change beyond A/A noise."),
)
# Commands that pass everything after `--` through to another program. (trace passes its
# --live arguments after `--` too, but options may follow its list of logs.)
PASSTHROUGH = {"serve", "bench"}

_state: dict[str, Any] = {"command": None, "debug": False}
_built: dict[str, Any] = {}  # name -> click command, built once per process
_app: Any = None


def command_function(name: str) -> Callable:
    """The function behind a command (imports its module)."""
    import importlib

    entry = next(c for c in COMMANDS if c.name == name)
    return getattr(importlib.import_module(f"bcgtune.cli.commands.{entry.module}"), entry.function)


def _guard(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Runs a command: turns what typer would otherwise swallow or reword (Ctrl-C, EOF, a
    closed stdout) into bcgtune's own exceptions, which typer passes through untouched."""
    from bcgtune.errors import InputError, Interrupted

    try:
        return func(*args, **kwargs)
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None
    except EOFError:
        raise InputError("unexpected end of input (standard input closed?)") from None
    except BrokenPipeError:
        raise StdoutClosed() from None


def _build_command(name: str) -> Any:
    """The click command for `name`: its module imported, its options typer's."""
    if name not in _built:
        import typer

        from bcgtune.cli.command import Command
        from bcgtune.cli.help import command_examples
        from bcgtune.cli.options import resolved_callable

        func = command_function(name)
        one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        settings = {"allow_interspersed_args": False} if name in PASSTHROUGH else {}
        wrapped = resolved_callable(func, _guard)
        one.command(name, cls=Command, context_settings=settings)(wrapped)
        cmd: Any = typer.main.get_command(one)
        cmd.examples = command_examples(func)
        _keep_argument_help(cmd, wrapped)
        _built[name] = cmd
    return _built[name]


def _keep_argument_help(cmd: Any, func: Callable) -> None:
    """typer 0.19 on click >= 8.2 loses an argument's help (click's Argument now takes `help`
    and resets it): put it back from the declaration."""
    import inspect

    import typer.models

    for p in cmd.params:
        if p.param_type_name != "argument" or p.help:
            continue
        param = inspect.signature(func).parameters.get(p.name)
        infos = [param.default] + list(getattr(param.annotation, "__metadata__", ())) if param else []
        p.help = next((i.help for i in infos if isinstance(i, typer.models.ArgumentInfo)), None)


def _version(value: bool) -> None:
    if value:
        import typer

        typer.echo(f"bcgtune {__version__}")
        raise typer.Exit()


def build_app() -> Any:
    import typer

    from bcgtune.cli.command import LazyGroup

    class Group(LazyGroup):
        table = tuple((c.name, c.summary) for c in COMMANDS)
        build = staticmethod(_build_command)

    app = typer.Typer(
        name="bcgtune",
        help="Tune and check the prefill CUDA graphs of an LLM server (SGLang breakable prefill graphs).",
        cls=Group,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
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

    return app


def get_app() -> Any:
    """The typer app (built on first use)."""
    global _app
    if _app is None:
        _app = build_app()
    return _app


def __getattr__(name: str) -> Any:
    if name == "app":  # `from bcgtune.cli.app import app` (tests, typer's CliRunner)
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _click_classes() -> tuple[type[BaseException], type[BaseException], type[BaseException]]:
    """(ClickException, Abort, Exit) of the click the installed typer runs on."""
    import typer

    click_exc = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return click_exc, typer.Abort, typer.Exit


def _flag_for(field: str | None) -> str | None:
    """The flag of the running command whose parameter is named `field` (the library names
    its inputs in domain terms; the parameter names match them)."""
    name = _state.get("command")
    cmd = _built.get(name) if field and name else None
    for p in getattr(cmd, "params", ()):
        tail = p.name.split("__")[-1] if p.name else ""
        if tail == field and getattr(p, "opts", None):
            longs = [o for o in p.opts if o.startswith("--")]
            return (longs or p.opts)[0]
    return None


def _message(exc: Any) -> str:
    if exc.field and not exc.where:
        flag = _flag_for(exc.field)
        if flag:
            return f"{exc.what} ({flag})"
    return str(exc)


def flush_stdout() -> None:
    """Push the result out now, so a failing stdout is reported like any other output."""
    from bcgtune.errors import ExternalError

    stream = sys.stdout
    if stream is None:
        return
    try:
        stream.flush()
    except BrokenPipeError:
        raise StdoutClosed() from None
    except ValueError:  # closed
        return
    except OSError as exc:
        raise ExternalError(f"cannot write: {exc.strerror or exc}", "standard output") from None


def _device_error(exc: BaseException) -> str | None:
    """The one-line message of a disk or device failure, None for anything else."""
    if isinstance(exc, OSError) and exc.errno in _DEVICE_ERRNOS:
        where = exc.filename if exc.filename is not None else "an output"
        return f"error: cannot write: {exc.strerror or os.strerror(exc.errno or 0)} ({where})"
    return None


def run(argv: list[str]) -> int:
    """Run one command line; return its exit code (never raises, except SystemExit from a
    command that owns the process, e.g. serve)."""
    try:
        return _run(argv)
    except KeyboardInterrupt:  # before typer was loaded, or while reporting
        err_line("error: interrupted")
        return EXIT_INTERRUPTED


def _run(argv: list[str]) -> int:
    from bcgtune.errors import BcgError

    _state["command"] = None
    _state["debug"] = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if argv[:2] == ["trace", "merge"]:
        argv = ["trace merge", *argv[2:]]
    if argv and argv[0] in ONE_BLAS_THREAD_COMMANDS:
        one_blas_thread()
    click_exc, abort, typer_exit = _click_classes()
    try:
        rv = get_app()(args=argv or ["--help"], prog_name="bcgtune", standalone_mode=False)
        flush_stdout()
        if isinstance(rv, int) and rv == EXIT_INTERRUPTED:
            err_line("error: interrupted")
        return rv if isinstance(rv, int) else 0
    except BcgError as exc:
        err_line(f"error: {_message(exc)}")
        return exc.exit_code
    except (StdoutClosed, BrokenPipeError):
        return 0
    except typer_exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except (click_exc, abort, KeyboardInterrupt, MemoryError) as exc:
        return _parser_or_stop(exc, click_exc)
    except SystemExit:
        raise
    except Exception as exc:
        return _unexpected(exc)


def _parser_or_stop(exc: BaseException, click_exc: type) -> int:
    """A usage error (exit 2), the end of stdin (2), Ctrl-C (130), or memory (3)."""
    if isinstance(exc, click_exc):
        param, what = getattr(exc, "param", None), getattr(exc, "message", None)
        if param is not None and getattr(param, "opts", None) and isinstance(what, str) and what.strip():
            from bcgtune.cli.command import flag_of_param

            what = " ".join(what.split()).removeprefix("Value error, ")  # typer 0.29 words pydantic's errors
            if what.startswith("Input should be "):
                what = "must be " + what.removeprefix("Input should be ")
            err_line(f"error: {what} ({flag_of_param(param)})")  # a bad value: what (where)
            return 2
        msg = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]
        cmd = _state.get("command")
        hint = f" (bcgtune {cmd} --help)" if cmd else " (bcgtune --help)"
        err_line(f"error: {msg or 'bad usage'}{hint}")
        return 2
    if isinstance(exc, MemoryError):
        err_line("error: out of memory (the input or an option asked for more than this machine has)")
        return EXIT_EXTERNAL
    if isinstance(exc.__cause__ or exc.__context__, EOFError):  # typer's Abort on a closed stdin
        err_line("error: unexpected end of input (standard input closed?)")
        return 2
    err_line("error: interrupted")
    return EXIT_INTERRUPTED


def _unexpected(exc: Exception) -> int:
    """A full disk or failing device (exit 3), a file name no file system takes (exit 2);
    anything else is a bug (exit 4)."""
    device = _device_error(exc)
    if device:
        err_line(device)
        return EXIT_EXTERNAL
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        name = str(exc.filename or "")
        err_line(f"error: file name too long ({name[:60] + '...' if len(name) > 60 else name})")
        return 2
    if _state["debug"]:
        raise exc
    what = " ".join(str(exc).split())[:160]
    err_line(
        f"error: internal error: {type(exc).__name__}{': ' + what if what else ''} "
        f"(a bug in bcgtune; rerun with `bcgtune --debug ...` or {DEBUG_ENV}=1 to see the traceback)"
    )
    return EXIT_INTERNAL


def _sigterm(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's own flush at exit cannot fail again (a
    reader that went away, a full disk) and print a traceback after our one line."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def _stopped_while_exiting(_signum, _frame) -> None:
    """Ctrl-C or SIGTERM after the command's outcome is settled (its files written or not,
    its message printed), while the interpreter winds down: exit 130 at once, as a stop at
    any other moment does (never 143, never a traceback from the shutdown)."""
    os._exit(EXIT_INTERRUPTED)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exits with the command's code. SIGTERM is Ctrl-C from the first
    line on, so a stop during start-up imports exits 130 like any other; as the process's
    own entry (no `argv`), a stop after the command, while Python exits, is 130 too."""
    try:
        old = signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # not the main thread (in-process tests)
        old = None
    try:
        code = run(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        err_line("error: interrupted")
        code = EXIT_INTERRUPTED
    finally:
        if old is not None and argv is None:
            signal.signal(signal.SIGINT, _stopped_while_exiting)
            signal.signal(signal.SIGTERM, _stopped_while_exiting)
        elif old is not None:
            signal.signal(signal.SIGTERM, old)
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
    sys.exit(code)
