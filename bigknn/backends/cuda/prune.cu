// Diversification of candidate lists (bigknn/algorithms/search_params.py DiversifyRule), one block of 256 threads a row:
// the kernels of bigknn/backends/cuda/diversify.py, the NumPy reference bigknn/backends/cpu/diversify.py. Candidates
// (rows, c) are rows of ``table`` (float32, m x dim), -1 at the end where a list is shorter, c <= DIV_MAX;
// keys (rows, c) ascending. A row's pair keys are computed as tiles of its candidates against each other
// (their rows staged in shared memory a chunk of dims at a time, each thread a 4 x 4 tile of pairs), not a
// candidate row a lane: each row then reads every candidate's vector once per tile instead of once per pair.
// Pair keys in float32 (the reference: float64), so near-ties may be decided the other way; an l2 twin of the
// row (key 0) occludes nothing in either.

#define DIV_THREADS 256
#define DIV_TILE 64   // candidates on each side of a tile (16 x 16 threads, 4 x 4 pairs each)
#define DIV_CHUNK 32  // dims staged at once
#define DIV_MAX 256   // bigknn/algorithms/search_params.py MAX_CANDIDATES
#define DIV_WORDS (DIV_MAX / 32)

// alpha d(a) < d(b) for keys a, b (cpu/diversify.py rule_less): d = sqrt(key) for l2, 1 + key for ip
template <int METRIC>
__device__ __forceinline__ bool rule_less(float a, float b, float alpha) {
    return METRIC == 0 ? alpha * alpha * a < b : alpha * (1.f + a) < 1.f + b;
}

// does candidate i (key ki to the row) occlude candidate j (key kj) with pair key pk? RULE 0: rng
// (d(i, j) <= d(row, j)); 1: gd with alpha (TSDG eq. 2); 2: TSDG §3.3's occlusion (gd with alpha 1)
template <int METRIC, int RULE>
__device__ __forceinline__ bool occludes(float ki, float kj, float pk, float alpha) {
    if (METRIC == 0 && !(ki > 0.f)) return false;  // a twin of the row occludes nothing (cpu/diversify.py says why)
    if (RULE == 0) return pk <= kj;
    const float a = RULE == 1 ? alpha : 1.f;
    return rule_less<METRIC>(ki, kj, a) && rule_less<METRIC>(pk, kj, a);
}

struct DiversifyShared {
    int cand[DIV_MAX];
    float key[DIV_MAX];
    unsigned bits[DIV_MAX * DIV_WORDS];  // bit i of row j's words: candidate i occludes candidate j
    float a[DIV_CHUNK][DIV_TILE + 1];    // a chunk of dims of a tile's candidates, dims first (+1: no conflicts)
    float b[DIV_CHUNK][DIV_TILE + 1];
};

// dims d0 .. d0 + DIV_CHUNK of candidates first .. first + DIV_TILE into s (zeros past c, dim, or EMPTY); a warp
// reads one candidate's 32 consecutive floats
__device__ __forceinline__ void stage_tile(float (*s)[DIV_TILE + 1], const float* __restrict__ table, int dim,
                                           const int* cand, int c, int first, int d0) {
    const int dd = threadIdx.x & 31;
    for (int p = threadIdx.x >> 5; p < DIV_TILE; p += DIV_THREADS / 32) {
        const int at = first + p;
        const int v = at < c ? cand[at] : -1;
        s[dd][p] = v >= 0 && d0 + dd < dim ? __ldg(table + (long long)v * dim + d0 + dd) : 0.f;
    }
}

// the row's candidates and keys into shared memory, and every pair's verdict into sh.bits: for the
// sequential rules (0, 1) only i before j, for occlusion (2) every i != j
template <int METRIC, int RULE>
__device__ void pair_bits(DiversifyShared& sh, const float* __restrict__ table, int dim,
                          const int* __restrict__ cands, const float* __restrict__ keys, int r, int c, float alpha) {
    const int words = (c + 31) >> 5;
    for (int t = threadIdx.x; t < c; t += DIV_THREADS) {
        sh.cand[t] = cands[(long long)r * c + t];
        sh.key[t] = keys[(long long)r * c + t];
    }
    for (int t = threadIdx.x; t < c * words; t += DIV_THREADS) sh.bits[t] = 0u;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int tiles = (c + DIV_TILE - 1) / DIV_TILE;
    for (int bi = 0; bi < tiles; ++bi) {
        for (int bj = bi; bj < tiles; ++bj) {
            float acc[4][4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[u][v] = 0.f;
            float (*tb)[DIV_TILE + 1] = bi == bj ? sh.a : sh.b;
            for (int d0 = 0; d0 < dim; d0 += DIV_CHUNK) {
                __syncthreads();  // the last chunk read (the first time: the candidates and cleared bits written)
                stage_tile(sh.a, table, dim, sh.cand, c, bi * DIV_TILE, d0);
                if (bi != bj) stage_tile(sh.b, table, dim, sh.cand, c, bj * DIV_TILE, d0);
                __syncthreads();
#pragma unroll 8
                for (int d = 0; d < DIV_CHUNK; ++d) {
                    float x[4], y[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        x[u] = sh.a[d][ty + 16 * u];
                        y[u] = tb[d][tx + 16 * u];
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u)
#pragma unroll
                        for (int v = 0; v < 4; ++v) acc[u][v] = key_term<METRIC>(acc[u][v], x[u], y[v]);
                }
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const int i = bi * DIV_TILE + ty + 16 * u, j = bj * DIV_TILE + tx + 16 * v;
                    if (i >= c || j >= c || i == j || sh.cand[i] < 0 || sh.cand[j] < 0) continue;
                    const float pk = METRIC == 0 ? acc[u][v] : -acc[u][v];
                    // a diagonal tile holds both (i, j) and (j, i); one off it only i < j, so it judges both ways
                    if ((RULE == 2 || i < j) && occludes<METRIC, RULE>(sh.key[i], sh.key[j], pk, alpha))
                        atomicOr(sh.bits + j * words + (i >> 5), 1u << (i & 31));
                    if (RULE == 2 && bi != bj && occludes<METRIC, RULE>(sh.key[j], sh.key[i], pk, alpha))
                        atomicOr(sh.bits + i * words + (j >> 5), 1u << (j & 31));
                }
            }
        }
    }
    __syncthreads();
}

// RULE 0 rng, 1 gd: each candidate judged against the kept ones before it; out: 1 kept, 0 dropped or empty
template <int METRIC, int RULE>
__global__ void __launch_bounds__(DIV_THREADS) diversify_kept(const float* __restrict__ table, int dim,
        const int* __restrict__ cands, const float* __restrict__ keys, int rows, int c, float alpha,
        unsigned char* __restrict__ out) {
    __shared__ DiversifyShared sh;
    __shared__ unsigned kept_words[DIV_WORDS];
    const int r = blockIdx.x;
    if (r >= rows) return;
    pair_bits<METRIC, RULE>(sh, table, dim, cands, keys, r, c, alpha);
    const int words = (c + 31) >> 5;
    if (threadIdx.x < 32) {  // one warp walks the list in order; lane w holds word w of the kept mask
        const int lane = threadIdx.x;
        unsigned kept = 0u;
        for (int j = 0; j < c; ++j) {
            const bool occluded = __any_sync(FULL_MASK, lane < words && (sh.bits[j * words + lane] & kept));
            if (!occluded && sh.cand[j] >= 0 && lane == (j >> 5)) kept |= 1u << (j & 31);
        }
        if (lane < words) kept_words[lane] = kept;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < c; j += DIV_THREADS)
        out[(long long)r * c + j] = (kept_words[j >> 5] >> (j & 31)) & 1u;
}

// TSDG §3.3: each candidate's occlusion factor, the candidates i (all, kept or not) with d(row, i) < d(row, j)
// and d(i, j) < d(row, j); 0 for empty slots
template <int METRIC>
__global__ void __launch_bounds__(DIV_THREADS) diversify_occlusion(const float* __restrict__ table, int dim,
        const int* __restrict__ cands, const float* __restrict__ keys, int rows, int c, int* __restrict__ out) {
    __shared__ DiversifyShared sh;
    const int r = blockIdx.x;
    if (r >= rows) return;
    pair_bits<METRIC, 2>(sh, table, dim, cands, keys, r, c, 1.f);
    const int words = (c + 31) >> 5;
    for (int j = threadIdx.x; j < c; j += DIV_THREADS) {
        int count = 0;
        if (sh.cand[j] >= 0)
            for (int w = 0; w < words; ++w) count += __popc(sh.bits[j * words + w]);
        out[(long long)r * c + j] = count;
    }
}
