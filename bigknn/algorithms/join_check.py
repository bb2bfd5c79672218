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


def check(x: np.ndarray, first_id: int, old: OldRows, got: Joined, k: int, exact: ExactFn, seed: int,
          cost: JoinCost) -> JoinCheck:
    """The join ``got`` of the batch ``x`` (global ids from ``first_id``) measured on samples (module
    docstring); ``k``: the store's k (recall@min(k, 10)). Its distances go to ``cost.check_distances``."""
    m = min(k, RECALL_AT)
    b = len(x)
    pick = np.sort(np.random.default_rng(seed).choice(b, min(b, CHECK_ROWS), replace=False))
    q = np.ascontiguousarray(x[pick], dtype=np.float32)
    truth = exact(q, min(m + 1, old.rows + b), chain(old.all_vectors(), [(first_id, x)]))
    cost.check_distances += len(q) * (old.rows + b)
    t_ids, t_keys = drop_self(truth.ids.astype(np.int64), truth.dists, first_id + pick)
    new_rows = estimate(got.new.ids[pick], got.new.dists[pick], t_ids[:, :m], t_keys[:, m - 1])
    near = np.unique(t_ids[(t_ids != EMPTY) & (t_ids < first_id)])
    if len(near) > CHECK_ROWS:
        near = np.sort(np.random.default_rng(seed + 1).choice(near, CHECK_ROWS, replace=False))
    cost.check_distances += len(near) * b
    return JoinCheck(new_rows, _old_rows(near, x, first_id, old, got, m, exact))


def _old_rows(near: np.ndarray, x: np.ndarray, first_id: int, old: OldRows, got: Joined, m: int,
              exact: ExactFn) -> Estimate:
    """Of the new rows each of ``near`` should now list, the share its joined list holds."""
    if not len(near):
        return Estimate(1.0, 1.0, 1.0, 0)
    committed_ids, committed_keys = old.lists(near)
    from_batch = exact(old.vectors(near), min(m, len(x)), [(first_id, x)])
    t_ids, t_keys = merge_lists(np.concatenate([committed_ids[:, :m], from_batch.ids.astype(np.int64)], axis=1),
                                np.concatenate([committed_keys[:, :m], from_batch.dists], axis=1), m)
    ids, keys = committed_ids, committed_keys
    at = np.minimum(np.searchsorted(got.changed, near), max(len(got.changed) - 1, 0))
    joined = got.changed[at] == near if len(got.changed) else np.zeros(len(near), dtype=bool)
    if joined.any():
        ids, keys = ids.copy(), keys.copy()
        ids[joined] = got.changed_lists.ids[at[joined]]
        keys[joined] = got.changed_lists.dists[at[joined]]
    return new_entry_recall(ids, keys, t_ids, t_keys[:, m - 1], t_ids >= first_id)
