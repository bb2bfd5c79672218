"""The knobs of pruning and search, with the papers' defaults, in one place (docs/design.md names the papers).

TSDG = Wang, Wang, Zhao, *Graph-based Approximate NN Search: A Revisit* (two-stage diversification, GPU batch
search); GGNN = Groh et al., *GGNN: Graph-Based GPU Nearest Neighbor Search* (symmetric linking, the slack
stopping rule); GRNND = Li et al., *GRNND: A GPU-Parallel Relative NN-Descent Algorithm* (the RNG rule).
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("tsdg", "rng")
PROCEDURES = ("auto", "small", "large")

# ---- pruning ------------------------------------------------------------------------------------
ALPHA = 1.2  # TSDG §3.2: the relaxation of the first stage, "usually greater than 1.1"
LAMBDA0 = 9  # TSDG §3.3: edges whose occlusion factor exceeds it are removed; the small-batch search visits < 10
SYM_MIDPOINT = 0.4  # GGNN §5.2.1: q_m = z + 0.4 (x - z), the worst-case query a symmetric link must serve
MAX_CANDIDATES = 256  # longest candidate list one row is diversified over (the CUDA kernels' shared rows)
NO_LAMBDA = 255  # the occlusion factor stored in an empty slot (and the cap of a stored factor)


@dataclass(frozen=True)
class DiversifyRule:
    """How a row's candidate list (ascending by distance to the row) is diversified.

    ``rng``: GRNND Alg. 2: candidate j is dropped when a kept closer candidate i has d(i, j) <= d(row, j).
    ``gd``: TSDG eq. (2): j is dropped when a kept closer candidate i has alpha d(row, i) < d(row, j) and
    alpha d(i, j) < d(row, j) (alpha = 1 is eq. (1), the plain graph diversification).
    ``occlusion``: TSDG §3.3: j's occlusion factor, the number of candidates i (all of them, kept or not) with
    d(row, i) < d(row, j) and d(i, j) < d(row, j).

    Distances d are the metric's: Euclidean for l2 (alpha scales it, not its square), 1 - x.y for ip.
    """

    kind: str  # "rng", "gd" or "occlusion"
    alpha: float = 1.0

    @property
    def sequential(self) -> bool:
        """Whether a candidate is judged against the kept ones only (a kept mask), not against all (a count)."""
        return self.kind != "occlusion"


@dataclass(frozen=True)
class PruneParams:
    """``bigknn prune``: the method, the most edges a row keeps (``degree``) and the TSDG constants."""

    method: str = "tsdg"
    degree: int = 32
    alpha: float = ALPHA
    lambda0: int = LAMBDA0

    def check(self, k: int) -> None:
        """ValueError naming the first knob that cannot work with a kNN graph of ``k`` neighbours per row."""
        if self.method not in METHODS:
            raise ValueError(f"--method {self.method}: choose one of {', '.join(METHODS)}")
        if not 2 <= self.degree <= MAX_CANDIDATES // 2:
            raise ValueError(f"--degree {self.degree} is outside 2..{MAX_CANDIDATES // 2}")
        if not self.alpha >= 1.0:
            raise ValueError(f"--alpha {self.alpha} must be at least 1 (it relaxes the rule; 1 is plain GD)")
        if not 0 <= self.lambda0 < NO_LAMBDA:
            raise ValueError(f"lambda0 {self.lambda0} is outside 0..{NO_LAMBDA - 1}")

    def forward_width(self, k: int) -> int:
        """Forward edges a row keeps before the reverse ones join: TSDG keeps all its first stage keeps (at most
        k); the RNG graph keeps at least half the degree for the nearest (GGNN §5.2: k_nn >= k/2), so
        ceil(degree / 2) at most, the rest left to symmetric links."""
        return k if self.method == "tsdg" else self.degree - self.degree // 2

    def candidate_width(self, k: int) -> int:
        """TSDG's second stage: the forward edges plus the nearest reverse ones, at most MAX_CANDIDATES."""
        return min(MAX_CANDIDATES, k + self.degree)


# ---- search -------------------------------------------------------------------------------------
SEEDS = 32  # the entry sample rows nearest each query that its searches start from (algorithms/search_index.py)
ENTRY_SAMPLE = 4096  # rows every query is compared with for its entry points (a GEMM a batch; algorithms/search_index.py)
SEARCH_K_MAX = 32  # the result list of one search is one warp wide (TSDG Alg. 1: 32 entries)
LAMBDA_VISIT = {"small": 10, "large": 5}  # TSDG §5.4: edges visited have occlusion factors below these
HOPS = {"small": 64, "large": 4096}  # hop limit T: Alg. 1 "converges in 4-5 iterations"; Alg. 2 ends first
LIST_MAX = 256  # longest search list of the large-batch procedure (its budget)
PARENTS = 4  # entries of the search list the large-batch procedure expands a hop (CAGRA's search_width)
WALK_HALF_MIN_DIM = 256  # the large procedure walks half-precision rows this wide (a multiple of 8) or wider: the
# walk reads rows at ~2.4 TB/s on an H100 (text 384-d, session 29); the list's first RERANK are re-keyed in float32
RERANK = 32  # entries of a half-precision walk's list re-keyed in float32 and re-sorted for the result
BUDGETS = {"small": (1, 2, 4, 8, 16, 32, 64, 128),  # t0: independent greedy searches per query (Alg. 1)
           "large": (10, 16, 24, 32, 48, 64, 96, 128, 192, 256)}  # the search list's length (Alg. 2's R)


@dataclass(frozen=True)
class SearchPlan:
    """One batch search: the procedure (``small``: TSDG Alg. 1, ``large``: Alg. 2), its budget (t0 searches per
    query, or the length of the search list), the neighbours wanted, the occlusion factors visited, the hop limit
    and the seed of the entry sample."""

    procedure: str
    budget: float
    k: int = 10
    seed: int = 0

    @property
    def lambda_visit(self) -> int:
        return LAMBDA_VISIT[self.procedure]

    @property
    def hops(self) -> int:
        return HOPS[self.procedure]

    @property
    def searches(self) -> int:
        """t0, the independent greedy searches per query of the small-batch procedure."""
        return max(1, int(self.budget))

    @property
    def list_length(self) -> int:
        """The large-batch procedure's search list: the budget, and never shorter than k."""
        return max(self.k, int(self.budget))

    def check(self) -> None:
        if self.procedure not in ("small", "large"):
            raise ValueError(f"procedure {self.procedure!r}: choose small or large")
        if not 1 <= self.k <= SEARCH_K_MAX:
            raise ValueError(f"--k {self.k}: outside 1..{SEARCH_K_MAX} (one search keeps {SEARCH_K_MAX} rows)")
        if self.procedure == "small" and (self.budget < 1 or self.budget != int(self.budget)):
            raise ValueError(f"--budget {self.budget:g}: the small-batch procedure takes a whole number of "
                             "searches per query (1, 2, 4, ...)")
        if self.procedure == "large" and not (1 <= self.budget <= LIST_MAX and self.budget == int(self.budget)):
            raise ValueError(f"--budget {self.budget:g}: the large-batch procedure takes a search list length, "
                             f"a whole number in 1..{LIST_MAX}")
