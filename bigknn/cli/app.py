"""The click group, its commands (registered here, explicitly), logging options, and the exit codes: 0 ok,
1 failure, 2 bad usage or input (one line on stderr), 130 SIGINT, 143 SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import NoReturn

import click

from bigknn import __version__
from bigknn.core import envvars
from bigknn.cli import build, evaluate, info, ingest, plan, products, search, synth, verify
from bigknn.core.errors import BigknnError, Interrupted
from bigknn.core.progress import configure_logging, log

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)  # both stop a run cleanly, exit code 128 + the signal number


def _set_level(level: int):
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            log.setLevel(level)
    return callback


def logging_options() -> list[click.Option]:
    """-q / -v, accepted by the group and by every command (``bigknn build -q ...``)."""
    return [click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, callback=_set_level(logging.WARNING),
                         help="Only warnings and errors on stderr: no progress bars or progress lines."),
            click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_set_level(logging.DEBUG),
                         help="Also log debug lines (each phase's start and end are logged without it).")]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="bigknn")
def cli() -> None:
    """Build approximate k-nearest-neighbour graphs of vector sets far larger than GPU memory.

    Progress shows as bars on a terminal, otherwise (cron, --json) as a log line on stderr every 30 s
    (BIGKNN_LOG_EVERY_S); results go to stdout. NO_COLOR is honoured.

    \b
    Quick start:
      bigknn synth data.fbin --rows 100000 --dim 96
      bigknn build data.fbin -o data.knn --k 32 --shard-rows 25000
      bigknn eval recall data.knn
      bigknn export data.knn -o graph.ibin
      bigknn synth q.fbin --rows 1000 --dim 96 --seed 1
      bigknn prune data.knn && bigknn search data.knn --queries q.fbin -o found.ibin
    """


COMMANDS = (build.build, build.merge, products.dedup, evaluate.eval_group, info.info, info.export, ingest.ingest, plan.plan,
            search.prune, search.search, search.truth, synth.synth, verify.verify)


def _register() -> None:
    cli.params.extend(logging_options())
    for command in COMMANDS:
        cli.add_command(command)
        for leaf in command.commands.values() if isinstance(command, click.Group) else [command]:
            leaf.params.extend(logging_options())


_register()


def main() -> None:
    """Console entry point: one-line errors and the documented exit codes. SIGINT and SIGTERM unwind alike
    (the lock is released, temporary files removed, the last commit stays) and exit 128 + the signal."""
    for signum in INTERRUPTS:
        signal.signal(signum, _interrupt)
    configure_logging(logging.INFO)
    try:
        envvars.check_all()
        cli.main(prog_name="bigknn", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.Abort:
        _fail("aborted", 1, kind=None)
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else "bigknn"
        _fail(f"{e.format_message()} (see {where} --help)", 2)
    except click.ClickException as e:
        _fail(e.format_message(), 2)
    except BigknnError as e:
        _fail(str(e), e.exit_code)
    except Interrupted as e:
        _fail(f"interrupted by {signal.Signals(e.signum).name}; rerun the same command (a build, merge or ingest "
              "resumes from its last commit)", 128 + e.signum, kind=None)
    except Exception as e:  # noqa: BLE001 - the CLI's last line of defence: one line, exit 1
        if os.environ.get("BIGKNN_DEBUG"):
            raise
        _fail(f"{type(e).__name__}: {e} (set BIGKNN_DEBUG=1 for a traceback)", 1, kind="failed")


def _fail(message: str, code: int, kind: str | None = "error") -> NoReturn:
    """Exit ``code`` with one line on stderr: "bigknn: <kind>: <message>" for people, and under --json one
    JSON object, ``{"error": message, "exit": code}``, for the scripts that asked for JSON."""
    if "--json" in sys.argv[1:sys.argv.index("--") if "--" in sys.argv else None]:
        click.echo(json.dumps({"error": message, "exit": code}), err=True)
    else:
        click.echo(f"bigknn: {kind}: {message}" if kind else f"bigknn: {message}", err=True)
    sys.exit(code)


def _interrupt(signum: int, frame: object) -> None:
    """Raise Interrupted in the main thread; a second signal ends the process at once (default action)."""
    for s in INTERRUPTS:
        signal.signal(s, signal.SIG_DFL)
    raise Interrupted(signum)
