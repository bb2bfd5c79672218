"""``bigknn verify``: check a store (fsck) and say what repairs it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigknn import api
from bigknn.cli.common import emit, json_option, wait_option


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--repair", "mend", is_flag=True,
              help="Under the writer lock, drop what is damaged and recomputable from the manifest "
                   "(a graph version, merged pairs, an interrupted ingest), so that `bigknn merge` redoes it.")
@wait_option
@json_option
def verify(store: Path, mend: bool, wait_s: float, as_json: bool) -> None:
    """Check a store: every chunk of its graphs and vectors against its checksum, the manifest against the
    arrays (rows, shapes, versions present, merged pairs, ids in range). Lists what is damaged and the
    commands that repair it: `bigknn merge` recomputes a lost graph version while the vectors are intact;
    damaged vectors need a rebuild from the input files. Exit 0: no damage (or --repair done), 1: damage.

    \b
    Examples:
      bigknn verify data.knn
      bigknn verify data.knn --json | jq .damaged
      bigknn verify data.knn --repair && bigknn merge data.knn
    """
    result = api.verify(store, repair=mend, wait=wait_s)
    if as_json:
        emit(result, as_json, "verify")
    else:
        show(result)
    if not result["ok"] and not mend:
        sys.exit(1)


def show(r: dict) -> None:
    """The report for people: a verdict line, one line per damaged file, the repair commands."""
    checked = f"{r['arrays']} arrays, {r['bytes'] / 1e9:.2f} GB checked in {r['wall_s']} s"
    click.echo(f"{r['store']}: {'ok' if r['ok'] else 'DAMAGED'} ({checked})")
    if r["arrays_without_checksums"]:
        click.echo(f"  {r['arrays_without_checksums']} arrays have no checksums (store format {r['format']}): "
                   "their contents cannot be verified; a rebuild gives a store with checksums")
    for d in r["damaged"]:
        click.echo(f"  {d['what']}: {d['file']}: {d['problem']}")
    for line in r.get("repaired", []):
        click.echo(f"repaired: {line}")
    if r["repair"]:
        click.echo("to repair:" if not r.get("repaired") else "next:")
        for step in r["repair"]:
            click.echo(f"  {step}")
