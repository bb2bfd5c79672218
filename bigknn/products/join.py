"""The exact cheapest edges that join a mutual-reachability graph's components (Borůvka's MST over them),
found by a scan that bounds before it measures.

A scan of every row outside the largest component against every row, each round, is quadratic where the
graph falls apart into many clusters (then nearly every row is outside the largest). Instead the rows are cut
into leaves of at most ``LEAF_ROWS`` rows, each inside one component (a component is split at the median of
its projection on a far pair until its parts are that small), and each leaf is a ball: centre, radius and
least core distance. Rows of two balls are at least (centre distance - both radii) apart (l2; an
inner-product analogue for ip and cosine), so their mutual reachability is at least the larger of that and
both balls' least core distance. Each leaf first measures the leaf of least bound in another component, which
gives its component an upper bound; then only leaves whose bound is under the component's best so far are
measured, and of a leaf only the rows whose own bound (a row is a ball of radius 0) is under it. For
separated clusters that is a few neighbouring leaves each: near-linear in rows. Bounds cost leaves^2 a round
(leaves >= rows / LEAF_ROWS, and >= components), and where balls overlap (high intrinsic dimension) they
prune less and the cost goes back towards the full scan. The edges are those the full scan finds, so the
joined graph is the same, up to float32 rounding (the bounds are widened by its slack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bigknn.core.metric import Metric, metric as metric_of, pairwise_keys
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.core.progress import log
from bigknn.shards import Store

LEAF_ROWS = 32  # rows a leaf holds at most: smaller balls bound tighter, and make more bounds to compute
BOUND_LEAVES = 256  # query leaves bounded at a time against all leaves (256 x leaves float64)
MEASURE_LEAVES = 256  # leaves measured against a query leaf at a time (a 32 x 8K float32 tile)
SLACK = 1e-4  # relative widening of each bound against float32 rounding of the measured distances


@dataclass
class Leaves:
    """Rows grouped into balls, each inside one component: leaf i holds ``rows[start[i]:start[i + 1]]``."""

    rows: np.ndarray  # (n,) int64 input rows, leaf by leaf
    start: np.ndarray  # (leaves + 1,) offsets into rows
    centre: np.ndarray  # (leaves, dim) float64
    radius: np.ndarray  # (leaves,) float64: farthest row from the centre
    min_core: np.ndarray  # (leaves,) float64: least core distance of the leaf's rows

    def members(self, leaf: int) -> np.ndarray:
        return self.rows[self.start[leaf]:self.start[leaf + 1]]


def join_components(store: Store, graph: Any, core: np.ndarray, labels: np.ndarray, count: int) -> Any:
    """``graph`` plus the cheapest cross-component edges, Borůvka round by round, until it is connected."""
    from scipy import sparse
    from scipy.sparse import csgraph

    x = all_vectors(store)
    leaves = leaves_of(x, labels, core)
    scan = Scan(x, core, metric_of(store.manifest.metric), leaves)
    a_all, b_all, w_all = [], [], []
    start = count
    while count > 1:
        log.info("mutual reachability: %d components; measuring the leaf pairs each one's bounds allow", count)
        a, b, w = scan.cheapest_links(labels, count)
        a_all.append(a)
        b_all.append(b)
        w_all.append(w)
        merged = sparse.coo_matrix((np.ones(len(a)), (labels[a], labels[b])), shape=(count, count))
        count, relabel = csgraph.connected_components(merged, directed=False)
        labels = relabel[labels]
    a, b, w = np.concatenate(a_all), np.concatenate(b_all), np.concatenate(w_all)
    # two components may pick the same edge from either end: keep it once (not summed by the sparse sum)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    _, once = np.unique(lo * len(core) + hi, return_index=True)
    lo, hi, w = lo[once], hi[once], w[once]
    log.info("mutual reachability: joined %d components with %d exact edges, measuring %d row pairs "
             "(%d leaves)", start, len(lo), scan.measured, len(leaves.radius))
    n = graph.shape[0]
    links = sparse.coo_matrix((np.concatenate([w, w]), (np.concatenate([lo, hi]), np.concatenate([hi, lo]))),
                              shape=(n, n)).tocsr()
    joined = (graph + links).tocsr()
    joined.sort_indices()
    return joined


def all_vectors(store: Store) -> np.ndarray:
    """(rows, dim) the stored vectors in input-row order."""
    m = store.manifest
    rowmap = RowMap.of(store)
    x = np.empty((m.rows, m.dim), np.dtype(m.dtype))
    for shard in m.shards:
        positions = np.arange(shard.offset, shard.offset + shard.rows)
        x[np.asarray(rowmap.to_input(positions), np.int64)] = store.read_vectors(shard.id)
    return x


def leaves_of(x: np.ndarray, labels: np.ndarray, core: np.ndarray) -> Leaves:
    """Each component's rows, split at the median of their projection on the line through a far pair until
    the parts hold at most ``LEAF_ROWS`` rows."""
    by_label = np.argsort(labels, kind="stable")
    cuts = np.nonzero(np.diff(labels[by_label]))[0] + 1
    stack = list(np.split(by_label, cuts))
    parts = []
    while stack:
        rows = stack.pop()
        if len(rows) <= LEAF_ROWS:
            parts.append(rows)
            continue
        v = x[rows].astype(np.float64)
        far = v[np.argmax(((v - v.mean(axis=0)) ** 2).sum(axis=1))]
        other = v[np.argmax(((v - far) ** 2).sum(axis=1))]
        side = np.argsort(v @ (other - far), kind="stable")
        half = len(rows) // 2
        stack += [rows[side[:half]], rows[side[half:]]]
    start = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=start[1:])
    centre = np.stack([x[p].astype(np.float64).mean(axis=0) for p in parts])
    radius = np.array([np.sqrt(((x[p].astype(np.float64) - c) ** 2).sum(axis=1).max()) for p, c in
                       zip(parts, centre)])
    min_core = np.array([core[p].min() for p in parts], np.float64)
    return Leaves(np.concatenate(parts).astype(np.int64), start, centre, radius, min_core)


class Scan:
    """Each Borůvka round's exact cheapest edge out of each component but the largest, by bounded leaf pairs."""

    def __init__(self, x: np.ndarray, core: np.ndarray, metric: Metric, leaves: Leaves) -> None:
        self.x, self.core, self.metric, self.leaves = x, core, metric, leaves
        self.norm = np.sqrt((leaves.centre ** 2).sum(axis=1))
        self.clip = not metric.dot_keys or metric.normalised  # distances never below 0
        self.scale = 1e-3 * float(self.norm.max(initial=0.0))  # absolute part of the rounding slack
        self.measured = 0

    def least(self, centre: np.ndarray, radius: np.ndarray, core: np.ndarray, to: np.ndarray) -> np.ndarray:
        """(len(centre), len(to)) float64: the least mutual reachability between a row of each query ball
        (``centre``, ``radius``, least ``core``; a row is a ball of radius 0) and a row of each leaf ``to``."""
        lv = self.leaves
        norm = np.sqrt((centre ** 2).sum(axis=1))
        dots = centre @ lv.centre[to].T
        if not self.metric.dot_keys:
            gap = np.sqrt(np.maximum(norm[:, None] ** 2 + self.norm[None, to] ** 2 - 2 * dots, 0.0))
            least = gap - radius[:, None] - lv.radius[None, to]
        else:  # a.b <= cq.cm + rq |cm| + (|cq| + rq) rm for a in ball (cq, rq), b in ball (cm, rm)
            least = 1.0 - (dots + radius[:, None] * self.norm[None, to]
                           + (norm + radius)[:, None] * lv.radius[None, to])
        if self.clip:
            least = np.maximum(least, 0.0)
        return np.maximum(np.maximum(least, core[:, None]), lv.min_core[None, to])

    def under(self, bound: np.ndarray, limit: float) -> np.ndarray:
        """Where ``bound`` may still beat ``limit``, given float32 rounding of the measured distances."""
        return bound <= limit + SLACK * (abs(limit) + self.scale)

    def measure(self, leaf: int, others: np.ndarray, limit: float) -> tuple[int, int, float] | None:
        """(row of ``leaf``, row of ``others``' leaves, their mutual reachability) of least mutual reachability,
        measuring only the rows whose own bound to some of ``others`` is under ``limit``; None where none is."""
        a = self.leaves.members(leaf)
        if np.isfinite(limit):
            near = self.under(self.least(self.x[a].astype(np.float64), np.zeros(len(a)), self.core[a].astype(
                np.float64), others), limit)
            a, others = a[near.any(axis=1)], others[near.any(axis=0)]
            if not len(a):
                return None
        b = np.concatenate([self.leaves.members(o) for o in others])
        d = self.metric.distance(pairwise_keys(self.x[a], self.x[b], self.metric.name))
        mr = np.maximum(np.maximum(d, self.core[a][:, None]), self.core[b][None, :])
        self.measured += mr.size
        i, j = np.unravel_index(np.argmin(mr), mr.shape)
        return int(a[i]), int(b[j]), float(mr[i, j])

    def cheapest_links(self, labels: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each component but the largest: (its row, another component's row, their mutual reachability)
        of least mutual reachability."""
        lv = self.leaves
        comp = labels[lv.rows[lv.start[:-1]]]
        everyone = np.arange(len(comp))
        largest = np.bincount(labels).argmax()
        query = np.nonzero(comp != largest)[0]
        best = np.full(count, np.inf)
        link = np.full((count, 2), -1, np.int64)

        def offer(leaf: int, others: np.ndarray) -> None:
            for s in range(0, len(others), MEASURE_LEAVES):
                found = self.measure(leaf, others[s:s + MEASURE_LEAVES], best[comp[leaf]])
                if found is not None and found[2] < best[comp[leaf]]:
                    best[comp[leaf]], link[comp[leaf]] = found[2], found[:2]

        for first_pass in (True, False):  # 1: each leaf's least-bound leaf, an upper bound; 2: all under it
            for s in range(0, len(query), BOUND_LEAVES):
                block = query[s:s + BOUND_LEAVES]
                bound = self.least(lv.centre[block], lv.radius[block], lv.min_core[block], everyone)
                bound[comp[block][:, None] == comp[None, :]] = np.inf
                for row, leaf in enumerate(block):
                    nearest = np.argmin(bound[row])
                    if first_pass:
                        offer(leaf, np.array([nearest]))
                        continue
                    bound[row, nearest] = np.inf  # measured in the first pass
                    near = np.nonzero(self.under(bound[row], best[comp[leaf]]))[0]
                    offer(leaf, near[np.argsort(bound[row, near], kind="stable")])
        mine = np.nonzero(link[:, 0] >= 0)[0]
        return link[mine, 0], link[mine, 1], best[mine].astype(np.float32)
