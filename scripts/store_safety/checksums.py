"""Cases: chunks swapped, damaged or stripped of their checksums, and environment variables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from store_safety.lab import case, graph_dir, ran, refusal


# ---- checksums -------------------------------------------------------------------------------------------------
def swap_case(name: str, src: Callable[[Path], Path], dst: Callable[[Path], Path]):
    def fn(lab):
        s = lab.store()
        a, b = src(s), dst(s)
        if a.stat().st_size != b.stat().st_size:
            return False, "sizes differ: not a swap"
        shutil.copyfile(a, b)
        code, damage = lab.damage(s)
        return code == 1 and str(b) in [d["file"] for d in damage], f"exit {code}; {len(damage)} damaged"
    case("checksum", name, "damage: verify exit 1 naming the chunk")(fn)


swap_case("shard 1's vectors chunk copied over shard 0's", lambda s: s / "shards/1/vectors/c/0/0",
          lambda s: s / "shards/0/vectors/c/0/0")
swap_case("a graph's dists chunk copied over its ids chunk (same size)",
          lambda s: graph_dir(s, 0) / "dists/c/0/0", lambda s: graph_dir(s, 0) / "ids/c/0/0")
swap_case("shard 2's graph ids chunk copied over shard 1's", lambda s: graph_dir(s, 2) / "ids/c/0/0",
          lambda s: graph_dir(s, 1) / "ids/c/0/0")


@case("checksum", "a graph version's whole array directory copied over another shard's",
      "damage: the array's metadata was written for another place")
def _(lab):
    s = lab.store()
    dst = graph_dir(s, 0) / "ids"
    shutil.rmtree(dst)
    shutil.copytree(graph_dir(s, 1) / "ids", dst)
    code, damage = lab.damage(s)
    problems = [d["problem"] for d in damage]
    return code == 1 and any("another place" in p or "written for" in p for p in problems), f"exit {code}"


@case("checksum", "a store renamed (mv) and verified", "exit 0: places are relative to the store")
def _(lab):
    s = lab.store()
    moved = s.with_name(s.name + ".moved")
    s.rename(moved)
    code, _, err = lab.run("verify", moved)
    return ran(code, err)


@case("checksum", "a format-6 array's table of checksums cut short", "damage, exit 1")
def _(lab):
    s = lab.store()
    meta_path = s / "shards/0/vectors/zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"]["bigknn_chunks"]["crc32c"] = []
    meta_path.write_text(json.dumps(meta))
    code, _ = lab.damage(s)
    return code == 1, f"exit {code}"


# ---- environment ---------------------------------------------------------------------------------------------
for var, value in [("BIGKNN_LOG_EVERY_S", "1e309"), ("BIGKNN_CHECKPOINT_S", "nan"),
                   ("DASK_SCHEDULER_ADDRESS", "local:0")]:
    def fn(lab, var=var, value=value):
        code, _, err = lab.run("merge", lab.store(), env=lab.env(**{var: value}))
        return refusal(code, err, var if var != "DASK_SCHEDULER_ADDRESS" else "local:0")
    case("environment", f"{var}={value}", "refused, exit 2, naming it")(fn)


@case("environment", "BIGKNN_CHECKPOINT_S set but empty", "the default: works")
def _(lab):
    code, _, err = lab.run("merge", lab.store(), env=lab.env(BIGKNN_CHECKPOINT_S=""))
    return ran(code, err)
