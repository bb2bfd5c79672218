"""Build parameters shared by every backend (one place for each default)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIN_LIST = 48  # NN-Descent converges poorly on short lists: graphs are built at least this wide
AUTO_SAMPLES = 16  # largest automatic p: 2p = 32 samples per list keep the cross-match in its small tile class
CPU_AUTO_SAMPLES = 12  # the CPU's: a core pays for every key, so fewer per iteration (more iterations) measured
# faster there. Random start, 100K x 96 synth, k = 32: p = 16 40 s (6 iterations), 8 31 s (9), 6 36 s (12); with
# the RP-tree start 8 and 12 tie (31-32 s); text 20K x 384 cosine: 8 33.5 s, 12 24.0 s, 16 31.7 s
CPU_HARD_SAMPLES = 20  # the CPU's p where the first iteration leaves the probe below CPU_HARD_BELOW (text
CPU_HARD_BELOW = 0.85  # embeddings: 0.36-0.44 at 30K x 384, synth 0.91, from 6 RP trees; from 20 trees text 10K
# / 30K / 100K 0.75 / 0.66 / 0.57, synth 0.996: text 10K took 12 iterations under a bar of 0.7, 4 under 0.85): text
# 30K x 384 cosine, lists of 48: p = 12 28.0 s (20 iterations, stalled at 0.981 and widened to 80), 20: 14.0 s (9
# iterations, no widening); synth keeps 12
CPU_HARD_WIDTH = 80  # and its lists this wide: text 100K x 384, p = 20, lists of 48: 31.6 s (16 iterations,
# stalled at 0.989 and widened to 80 at iteration 13); lists of 80 from the start: 23.8 s (8 iterations, 0.993)
EXACT_ROWS = 2048  # shards up to this size get their exact graph: too few rows for NN-Descent to mix well


@dataclass(frozen=True)
class GnndParams:
    """GNND and GGM knobs (§4 and §5.1 of the GNND paper: Wang, Zhao, Zeng, "Fast k-NN Graph Construction by
    GPU based NN-Descent"; docs/design.md).

    k: neighbours per row the user asked for; graphs are built and stored ``width()`` wide and cut to k
    on output (export, eval). recall: the recall@10 each descent (GNND of a shard, GGM of a pair) aims at,
    measured on a probe of its rows after every iteration (bigknn/recall.py); lists widen where it stalls
    below. 0: no target, the experts' fixed behaviour: ``iters`` iterations or the update-fraction rule.
    samples: p, the NEW and the OLD samples taken per list per iteration (reverse samples fill each sample
    list up to 2p). iters: iteration cap. min_update_frac: without a target, stop once an iteration changes
    fewer than this fraction of the n*k list entries. merge_iters: iteration cap of GGM.
    """

    k: int = 32
    recall: float = 0.99
    samples: int = 0  # 0: automatic, see sample_count()
    iters: int = 60
    min_update_frac: float = 0.05
    merge_iters: int = 30
    list_width: int = 0  # 0: automatic, see width()

    def width(self) -> int:
        """Entries per list while building and in the store (>= k; the first k are the answer). Wider
        lists converge to a higher recall@k: on 1M x 96, k=32, lists of 48 reach 0.991 where 32 plateau
        near 0.985 (docs/perf-notes.md)."""
        return max(self.k, self.list_width or MIN_LIST)

    def sample_count(self, width: int = 0, cap: int = AUTO_SAMPLES) -> int:
        """p for lists of ``width`` entries (default: ``width()``): the user's, or a third of the width up to
        AUTO_SAMPLES. The cross-match costs ~(2p)^2 per list whatever the width, so a fixed p keeps the cost of
        wider lists about linear (p = 24 doubled the sample tile and made lists of 96 cost 5x lists of 64).
        ``cap``: the largest automatic p (CPU_AUTO_SAMPLES on the CPU)."""
        return self.samples if self.samples > 0 else max(4, min(cap, (width or self.width()) // 3))

    def to_dict(self) -> dict:
        return asdict(self)
