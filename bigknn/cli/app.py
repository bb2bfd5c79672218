"""The click group, exit codes (0 ok, 1 failure, 2 bad usage or input, 130 SIGINT, 143 SIGTERM) and output
helpers."""

from __future__ import annotations

import json
import os
import signal
import sys

import click
from rich.console import Console
from rich.table import Table

from bigknn import __version__
from bigknn.errors import BigknnError, Interrupted
from bigknn.progress import Reporter, RichReporter

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)  # both stop a run cleanly, exit code 128 + the signal number


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="bigknn")
def cli() -> None:
    """Build approximate k-nearest-neighbour graphs of vector sets far larger than GPU memory.

    \b
    Quick start:
      bigknn synth data.fbin --rows 100000 --dim 96
      bigknn build data.fbin -o data.knn --k 32 --shard-rows 25000
      bigknn eval recall data.knn
      bigknn export data.knn -o graph.ibin
    """


def main() -> None:
    """Console entry point: one-line errors and the documented exit codes. SIGINT and SIGTERM unwind alike
    (the lock is released, temporary files removed, the last commit stays) and exit 128 + the signal."""
    for signum in INTERRUPTS:
        signal.signal(signum, _interrupt)
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("bigknn: aborted", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(2)
    except BigknnError as e:
        click.echo(f"bigknn: error: {e}", err=True)
        sys.exit(e.exit_code)
    except Interrupted as e:
        click.echo(f"bigknn: interrupted by {signal.Signals(e.signum).name}; rerun the same command (a build, "
                   "merge or ingest resumes from its last commit)", err=True)
        sys.exit(128 + e.signum)
    except Exception as e:  # noqa: BLE001 - the CLI's last line of defence: one line, exit 1
        if os.environ.get("BIGKNN_DEBUG"):
            raise
        click.echo(f"bigknn: failed: {type(e).__name__}: {e} (set BIGKNN_DEBUG=1 for a traceback)", err=True)
        sys.exit(1)


def _interrupt(signum: int, frame: object) -> None:
    """Raise Interrupted in the main thread; a second signal ends the process at once (default action)."""
    for s in INTERRUPTS:
        signal.signal(s, signal.SIG_DFL)
    raise Interrupted(signum)
def show_progress(as_json: bool) -> bool:
    """Progress bars for people on a terminal; none for scripts (--json) or logs (stderr not a tty)."""
    return not as_json and sys.stderr.isatty()


def reporter_for(as_json: bool) -> Reporter:
    return RichReporter() if show_progress(as_json) else Reporter()


def emit(result: dict, as_json: bool, title: str) -> None:
    """Print a result: one JSON object for scripts, or a small table for people."""
    if as_json:
        click.echo(json.dumps(result))
        return
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in result.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        table.add_row(key, str(value))
    Console().print(table)


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
wait_option = click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
                           help="Seconds to wait for another writer to release the store.")
backend_option = click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                              show_default=True, help="auto uses the GPU when CuPy and a device are present.")
gpu_mem_option = click.option("--gpu-mem", "gpu_mem", type=str, default=None,
                              help="Cap on GPU memory to use per GPU, e.g. 8G or 512M (default: what is free).")
gpus_option = click.option("--gpus", type=str, default=None,
                           help="GPUs to use: 'all' or ids like 0,1 (one worker each; default: GPU 0).")
host_mem_option = click.option("--host-mem", "host_mem", type=str, default=None,
                               help="Host RAM for cached shards, e.g. 64G (default: half the machine's RAM).")


def parse_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a size like 8G or 512M") from None


from bigknn.cli import build as _build, evaluate as _evaluate, info as _info, ingest as _ingest, plan as _plan, synth as _synth, verify as _verify  # noqa: E402,F401,I001
