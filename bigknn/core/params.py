"""Build parameters shared by every backend (one place for each default)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

MIN_LIST = 48  # NN-Descent converges poorly on short lists: graphs are built at least this wide
AUTO_SAMPLES = 16  # largest automatic p: 2p = 32 samples per list keep the cross-match in its small tile class
CPU_AUTO_SAMPLES = 8  # the CPU's: a core pays for every key, so fewer per iteration (more iterations) measured
# faster there (docs/perf-notes.md, "Measurements behind the constants")
SEEDED_SAMPLES = 8  # a seeded merge's largest automatic p (no target: the update rule ends it). On both backends
# twice this p left its batch rows below at the same iterations (docs/perf-notes.md, session 49)
CPU_HARD_SAMPLES = 20  # the CPU's p where the first iteration leaves the probe below CPU_HARD_BELOW (a hard set:
CPU_HARD_BELOW = 0.85  # text embeddings start far below it, clustered synth above it; docs/perf-notes.md)
CPU_HARD_WIDTH = 80  # and its lists this wide: a hard set stalls below its target at the default width
EXACT_ROWS = 2048  # shards up to this size get their exact graph: too few rows for NN-Descent to mix well


@dataclass(frozen=True)
class GnndParams:
    """GNND and GGM knobs (§4 and §5.1 of the GNND paper: Wang, Zhao, Zeng, "Fast k-NN Graph Construction by
    GPU based NN-Descent"; docs/design.md).

    k: neighbours per row the user asked for; graphs are built and stored ``width()`` wide and cut to k
    on output (export, eval). recall: the recall@10 each descent (GNND of a shard, GGM of a pair) aims at,
    measured on a probe of its rows after every iteration (bigknn/algorithms/recall_target.py); lists widen where it stalls
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

    def sample_count(self, width: int = 0, cap: int = AUTO_SAMPLES, seeded: bool = False) -> int:
        """p for lists of ``width`` entries (default: ``width()``): the user's, or a third of the width up to
        AUTO_SAMPLES. The cross-match costs ~(2p)^2 per list whatever the width, so a fixed p keeps the cost of
        wider lists about linear (p = 24 doubled the sample tile and made lists of 96 cost 5x lists of 64).
        ``cap``: the largest automatic p (CPU_AUTO_SAMPLES on the CPU); ``seeded``: a seeded merge's, which
        also stays within SEEDED_SAMPLES."""
        if seeded:
            cap = min(cap, SEEDED_SAMPLES)
        return self.samples if self.samples > 0 else max(4, min(cap, (width or self.width()) // 3))

    def to_manifest(self) -> dict:
        """The manifest's ``params`` object (every field, as JSON numbers)."""
        return asdict(self)

    @classmethod
    def from_manifest(cls, raw: dict) -> GnndParams:
        """The manifest's ``params`` object read back; fields an older store did not record take their
        defaults (shards/schema.py has checked that every key is a field and every value a number)."""
        return cls(**{f.name: raw[f.name] for f in fields(cls) if f.name in raw})
