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

from bigknn.errors import BadInput
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


def in_existing_directory(path: Path, option: str) -> Path:
    """Refuse (exit 2) an output whose directory does not exist: a typo in -o must not create directories."""
    parent = Path(path).absolute().parent
    if not parent.is_dir():
        raise BadInput(path, f"{option}: the directory {parent} does not exist; create it first")
    return path


def parse_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a size like 8G, 512M or 1000000 (bytes)") from None


def size_text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A size option's check as it is parsed, so that the error names the option (--host-mem 1X)."""
    parse_bytes(value)
    return value


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
wait_option = click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
                           help="Seconds to wait for another writer to release the store.")
backend_option = click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                              show_default=True, help="auto uses the GPU when CuPy and a device are present.")
threads_option = click.option("--threads", type=click.IntRange(min=1), default=None,
                              help="CPU threads of the CPU backend's compiled loops (default: all cores).")
gpu_mem_option = click.option("--gpu-mem", "gpu_mem", type=str, default=None, callback=size_text,
                              help="Cap on GPU memory to use per GPU, e.g. 8G or 512M (default: what is free).")
gpus_option = click.option("--gpus", type=str, default=None,
                           help="GPUs to use: 'all' or ids like 0,1 (one worker each; default: GPU 0).")
host_mem_option = click.option("--host-mem", "host_mem", type=str, default=None, callback=size_text,
                               help="Host RAM for cached shards, e.g. 64G (default: half the machine's RAM).")

scheduler_option = click.option(
    "--scheduler", type=str, default=None, envvar="DASK_SCHEDULER_ADDRESS", show_envvar=True,
    help="Run the GNND and merge tasks on a Dask cluster: its scheduler's address (tcp://host:8786), or "
         "local:N for N local worker processes (GPU workers with dask-cuda). The store must be on a path "
         "every worker sees. Needs dask and distributed (the [dask] extra).")

plot_option = click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
                           help="Also draw a picture into this file (.png, .svg, .pdf; needs matplotlib: "
                                "the [plot] extra).")
