"""Whether a join (bigknn/algorithms/graph_join.py) reached the store's recall target, measured, not assumed.

A search of a kNN graph finds a new row's neighbours well where the data has low intrinsic dimension, and less
well where it has high: on 64-d Gaussian rows, k = 4, a beam of 64 found 0.83 of the new rows' neighbours
(docs/perf-notes.md, session 38). So each join is checked on a sample of its rows, in the terms a build's
descents are held to (bigknn/algorithms/recall_target.py: recall@10, or @k where k < 10, ties counted):

* the new rows: CHECK_ROWS of them, their exact neighbours among the old rows and the batch;
* the old rows near the batch (those among the sampled rows' exact neighbours, at most CHECK_ROWS): of the
  new rows their lists should now hold (exact over the batch, merged with their committed lists), the share
  they hold (``new_entry_recall``: what the join had to find, as a merge's probe counts it).

The first pass reads every old row once (the exact search); the old rows' side costs CHECK_ROWS x batch
distances.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from bigknn.algorithms.graph_join import ExactFn, JoinCost, Joined, OldRows
from bigknn.algorithms.recall_target import RECALL_AT, Estimate, estimate, new_entry_recall
from bigknn.core.knn_graph import EMPTY, drop_self, merge_lists

CHECK_ROWS = 256  # sampled new rows, and at most this many old rows near them


@dataclass(frozen=True)
class JoinCheck:
    """A join's recall on its new rows and on the old rows near them."""

    new_rows: Estimate
    old_rows: Estimate

    def reached(self, target: float) -> bool:
        """Both sides at the target (point estimates: a sample of CHECK_ROWS gives about +-0.005 at 0.99)."""
        return self.new_rows.recall >= target and self.old_rows.recall >= target

    def to_dict(self) -> dict:
        return {"new_rows": self.new_rows.to_dict(), "old_rows": self.old_rows.to_dict()}


@dataclass(frozen=True)
class CheckTruth:
    """What a batch's joins are measured against, whatever their effort: the sampled new rows (``pick``, batch
    positions) and their exact lists; the old rows near them, their committed lists and their exact lists over
    the committed lists and the batch."""

    first_id: int
    m: int  # recall@m
    pick: np.ndarray
    new_ids: np.ndarray
    new_keys: np.ndarray
    near: np.ndarray
    committed_ids: np.ndarray
    committed_keys: np.ndarray
    near_ids: np.ndarray
    near_keys: np.ndarray


def truth(x: np.ndarray, first_id: int, old: OldRows, k: int, exact: ExactFn, seed: int,
          cost: JoinCost) -> CheckTruth:
    """The exact side of the check of the batch ``x`` (global ids from ``first_id``), computed once for all its
    efforts (module docstring); ``k``: the store's k (recall@min(k, 10)). Its distances go to
    ``cost.check_distances``."""
    m = min(k, RECALL_AT)
    b = len(x)
    pick = np.sort(np.random.default_rng(seed).choice(b, min(b, CHECK_ROWS), replace=False))
    q = np.ascontiguousarray(x[pick], dtype=np.float32)
    got = exact(q, min(m + 1, old.rows + b), chain(old.all_vectors(), [(first_id, x)]))
    cost.check_distances += len(q) * (old.rows + b)
    new_ids, new_keys = drop_self(got.ids.astype(np.int64), got.dists, first_id + pick)
    near = np.unique(new_ids[(new_ids != EMPTY) & (new_ids < first_id)])
    if len(near) > CHECK_ROWS:
        near = np.sort(np.random.default_rng(seed + 1).choice(near, CHECK_ROWS, replace=False))
    committed_ids, committed_keys = old.lists(near)
    near_ids, near_keys = committed_ids[:, :m], committed_keys[:, :m]
    if len(near):
        from_batch = exact(old.vectors(near), min(m, b), [(first_id, x)])
        cost.check_distances += len(near) * b
        near_ids, near_keys = merge_lists(np.concatenate([near_ids, from_batch.ids.astype(np.int64)], axis=1),
                                          np.concatenate([near_keys, from_batch.dists], axis=1), m)
    return CheckTruth(first_id, m, pick, new_ids[:, :m], new_keys[:, :m], near, committed_ids, committed_keys,
                      near_ids, near_keys)


def check(t: CheckTruth, got: Joined) -> JoinCheck:
    """The join ``got`` measured against ``t``: its sampled new rows' lists, and the joined lists of the old
    rows near them (of the new rows they should now list, the share they hold)."""
    new_rows = estimate(got.new.ids[t.pick], got.new.dists[t.pick], t.new_ids, t.new_keys[:, -1])
    if not len(t.near):
        return JoinCheck(new_rows, Estimate(1.0, 1.0, 1.0, 0))
    ids, keys = t.committed_ids, t.committed_keys
    at = np.minimum(np.searchsorted(got.changed, t.near), max(len(got.changed) - 1, 0))
    joined = got.changed[at] == t.near if len(got.changed) else np.zeros(len(t.near), dtype=bool)
    if joined.any():
        ids, keys = ids.copy(), keys.copy()
        ids[joined] = got.changed_lists.ids[at[joined]]
        keys[joined] = got.changed_lists.dists[at[joined]]
    return JoinCheck(new_rows, new_entry_recall(ids, keys, t.near_ids, t.near_keys[:, -1],
                                                t.near_ids >= t.first_id))
