"""What the command modules share: options, size parsing, progress and result output. Imports nothing of
the command line itself, so that the command modules import it and ``app.py`` imports them (no cycle)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from bigknn.backends import BACKENDS
from bigknn.core.errors import BadInput
from bigknn.core.human import human_bytes, human_duration
from bigknn.core.progress import Reporter, RichReporter, log


def show_progress(as_json: bool) -> bool:
    """Progress bars for people on a terminal; log lines instead for scripts (--json), logs (stderr not a
    tty) and --quiet."""
    return not as_json and sys.stderr.isatty() and log.isEnabledFor(logging.INFO)


def reporter_for(as_json: bool) -> Reporter:
    return RichReporter() if show_progress(as_json) else Reporter()


def emit(result: dict, as_json: bool, title: str) -> None:
    """Print a result on stdout: one JSON object for scripts, or a small table for people (sizes and durations
    in human units, dtypes by name, nested data as sub-tables; long lists of records are left to --json)."""
    if as_json:
        click.echo(json.dumps(result))
        return
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in result.items():
        table.add_row(key, cell(key, value))
    Console().print(table)


LONG_LIST = 12  # a list of more records than this is counted in the table, listed by --json


def cell(key: str, value: Any, unit: str = "") -> Any:
    """``value`` of ``key`` for a person: a string, or a rich Table of a nested record. ``unit``: the unit
    its parent's key names (``timings_s``: every number under it is seconds)."""
    unit = unit_of(key) or unit
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return number(value, unit)
    if key == "dtype" and isinstance(value, str):
        return dtype_name(value)
    if isinstance(value, dict):
        if all(not isinstance(v, (dict, list)) or _pair(v) for v in value.values()):
            return ", ".join(f"{k} {cell(k, v, unit)}" for k, v in value.items())
        sub = Table(show_header=False, box=None, pad_edge=False)
        for k, v in value.items():
            sub.add_row(str(k), cell(k, v, unit))
        return sub
    if isinstance(value, list):
        if not value:
            return "none"
        if _pair(value):  # a span: (start, end)
            return f"{number(value[0], unit)} - {number(value[1], unit)}"
        if value and all(isinstance(v, dict) for v in value):
            if len(value) > LONG_LIST:
                return f"{len(value):,} records (--json lists them)"
            sub = Table(box=None, pad_edge=False)
            columns = list(dict.fromkeys(k for v in value for k in v))
            for c in columns:
                sub.add_column(c)
            for v in value:
                sub.add_row(*(_plain(cell(c, v.get(c), unit)) for c in columns))
            return sub
        return ", ".join(_plain(cell(key, v, unit)) for v in value)
    return str(value)


def unit_of(key: str) -> str:
    """The unit a key's name gives its numbers: bytes, seconds or a fraction."""
    for suffix, unit in (("_bytes", "bytes"), ("_s", "s"), ("_frac", "frac")):
        if str(key).endswith(suffix):
            return unit
    return ""


def number(value: float, unit: str) -> str:
    if unit == "bytes":
        return human_bytes(value)
    if unit == "s":
        return human_duration(value)
    if unit == "frac":
        return f"{100 * value:.0f} %"
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    return f"{value:.4g}"


def dtype_name(text: str) -> str:
    """"<f4" as people say it: float32."""
    try:
        return np.dtype(text).name
    except TypeError:
        return text


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else "(see --json)"


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
        size = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, OverflowError):
        raise click.BadParameter(f"{text!r} is not a size like 8G, 512M or 1000000 (bytes)") from None
    if size < 0:
        raise click.BadParameter(f"{text!r} is negative; give a size like 8G or 512M")
    return size


def size_text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A size option's check as it is parsed, before any work, so that the error names the option
    (--host-mem 1X); the command parses it again where used."""
    parse_bytes(value)
    return value


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
wait_option = click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
                           help="Seconds to wait for another writer to release the store.")
backend_option = click.option("--backend", type=click.Choice(BACKENDS), default="auto",
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
