"""Build parameters shared by every backend (one place for each default)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIN_LIST = 32  # NN-Descent converges poorly on short lists: graphs are built at least this wide
EXACT_ROWS = 2048  # shards up to this size get their exact graph: too few rows for NN-Descent to mix well


@dataclass(frozen=True)
class GnndParams:
    """GNND (paper 000 §4) and GGM (§5.1) knobs.

    k: neighbours per row the user asked for; graphs are built and stored ``width()`` wide and cut to k
    on output (export, eval). samples: p, the NEW and the OLD samples taken per list per iteration (reverse
    samples fill each sample list up to 2p). iters: iteration cap. min_update_frac: stop once an
    iteration changes fewer than this fraction of the n*k list entries. merge_iters: iteration cap of GGM.
    """

    k: int = 32
    samples: int = 0  # 0: automatic, see sample_count()
    iters: int = 12
    min_update_frac: float = 0.05
    merge_iters: int = 8
    list_width: int = 0  # 0: automatic, see width()

    def width(self) -> int:
        """Entries per list while building and in the store (>= k; the first k are the answer). Wider
        lists converge to a higher recall@k: on 1M x 96, k=32, lists of 48 reach 0.991 where 32 plateau
        near 0.985 (docs/perf-notes.md)."""
        return max(self.k, self.list_width or MIN_LIST)

    def sample_count(self) -> int:
        return self.samples if self.samples > 0 else max(4, min(32, self.width() // 4))

    def to_dict(self) -> dict:
        return asdict(self)
