"""What the command modules share: options, size parsing, progress and result output. Imports nothing of
the command line itself, so that the command modules import it and ``app.py`` imports them (no cycle)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bigknn.backends import BACKENDS
from bigknn.progress import Reporter, RichReporter, log


def show_progress(as_json: bool) -> bool:
    """Progress bars for people on a terminal; log lines instead for scripts (--json), logs (stderr not a
    tty) and --quiet."""
    return not as_json and sys.stderr.isatty() and log.isEnabledFor(logging.INFO)


def reporter_for(as_json: bool) -> Reporter:
    return RichReporter() if show_progress(as_json) else Reporter()


def emit(result: dict, as_json: bool, title: str) -> None:
    """Print a result on stdout: one JSON object for scripts, or a small table for people."""
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


def parse_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        size = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, OverflowError):
        raise click.BadParameter(f"{text!r} is not a size like 8G or 512M") from None
    if size < 0:
        raise click.BadParameter(f"{text!r} is negative; give a size like 8G or 512M")
    return size


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
wait_option = click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
                           help="Seconds to wait for another writer to release the store.")
backend_option = click.option("--backend", type=click.Choice(BACKENDS), default="auto",
                              show_default=True, help="auto uses the GPU when CuPy and a device are present.")
threads_option = click.option("--threads", type=click.IntRange(min=1), default=None,
                              help="CPU threads of the CPU backend's compiled loops (default: all cores).")
def _size_text(ctx: click.Context, param: click.Parameter, text: str | None) -> str | None:
    """Check a size option as it is parsed (before any work); the command parses it again where used."""
    parse_bytes(text)
    return text


gpu_mem_option = click.option("--gpu-mem", "gpu_mem", type=str, default=None, callback=_size_text,
                              help="Cap on GPU memory to use per GPU, e.g. 8G or 512M (default: what is free).")
gpus_option = click.option("--gpus", type=str, default=None,
                           help="GPUs to use: 'all' or ids like 0,1 (one worker each; default: GPU 0).")
host_mem_option = click.option("--host-mem", "host_mem", type=str, default=None, callback=_size_text,
                               help="Host RAM for cached shards, e.g. 64G (default: half the machine's RAM).")

scheduler_option = click.option(
    "--scheduler", type=str, default=None, envvar="DASK_SCHEDULER_ADDRESS", show_envvar=True,
    help="Run the GNND and merge tasks on a Dask cluster: its scheduler's address (tcp://host:8786), or "
         "local:N for N local worker processes (GPU workers with dask-cuda). The store must be on a path "
         "every worker sees. Needs bigknn[dask].")

plot_option = click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
                           help="Also draw a picture into this file (.png, .svg, .pdf; needs matplotlib: "
                                "pip install 'bigknn[plot]').")
