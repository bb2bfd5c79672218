"""The plan step of a partitioned build: after every shard's GNND, choose the shard pairs to merge.

The choice (bigknn/algorithms/partition/pairs.py) reads the recall sample's exact neighbours, complete once every shard
has been seen, and is committed to the manifest before the first merge: a run killed during the merges
resumes the same plan, never a new one drawn on other shards.
"""

from __future__ import annotations

import numpy as np

from bigknn.backends import Backend
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition.pairs import choose_pairs, pair_masses
from bigknn.engine.recall_sample import SampleTruth
from bigknn.core.progress import Reporter
from bigknn.shards import Store


def plan_pairs(store: Store, backend: Backend, sample: SampleTruth | None, reporter: Reporter) -> None:
    """Choose and commit ``manifest.pairs`` of a partitioned store that has none yet (no-op otherwise).
    ``sample``: the build's recall sample; None draws it again from the store."""
    m = store.manifest
    if m.partition is None or m.pairs is not None:
        return
    sample = SampleTruth.from_store(store) if sample is None else sample
    sample.complete(store, backend)
    positions = sample.positions(store)
    truth, _ = sample.truth(positions)
    starts = np.array([s.offset for s in m.shards], np.int64)
    shard_of = np.searchsorted(starts, np.maximum(truth, 0), side="right") - 1
    mass, within = pair_masses(np.searchsorted(starts, positions, side="right") - 1,
                               np.where(truth >= 0, shard_of, -1), len(m.shards))
    m.pairs = choose_pairs(mass, within, m.params.recall or GnndParams().recall)
    store.commit()
    reporter.note(f"{store.path}: {len(m.pairs)} of {len(m.shards) * (len(m.shards) - 1) // 2} shard pairs "
                  "to merge (the near pairs that hold the recall sample's neighbours)")
