// Diversification of candidate lists (bigknn/search/params.py DiversifyRule), one warp a row: the kernels of
// bigknn/backends/cuda/prune.py, the NumPy reference bigknn/backends/cpu/prune.py. Candidates (rows, c) are
// rows of ``table`` (float32, m x dim), -1 at the end where a list is shorter; keys (rows, c) ascending. Pair
// keys in float32 (the reference: float64), so near-ties may be decided the other way; an l2 twin of the row
// (key 0) occludes nothing in either.

// alpha d(a) < d(b) for keys a, b (cpu/prune.py rule_less): d = sqrt(key) for l2, 1 + key for ip
template <int METRIC>
__device__ __forceinline__ bool rule_less(float a, float b, float alpha) {
    return METRIC == 0 ? alpha * alpha * a < b : alpha * (1.f + a) < 1.f + b;
}

// key between rows a and b of the table (search.cu row_key, which comes first in the one source)
template <int METRIC>
__device__ __forceinline__ float pair_key(const float* __restrict__ table, int dim, int a, int b) {
    return row_key<METRIC>(table, dim, b, table + (long long)a * dim);
}

// RULE 0: rng (d(i, j) <= d(row, j) drops j); RULE 1: gd with alpha (TSDG eq. 2). Each candidate is judged
// against the kept ones before it; out: 1 kept, 0 dropped or empty. Shared memory: c ints a warp.
template <int METRIC, int RULE>
__global__ void __launch_bounds__(128) diversify_kept(const float* __restrict__ table, int dim,
        const int* __restrict__ cands, const float* __restrict__ keys, int rows, int c, float alpha,
        unsigned char* __restrict__ out) {
    extern __shared__ int kept_at[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    int* kept = kept_at + warp * c;  // positions of the kept candidates, in order
    const int* cr = cands + (long long)r * c;
    const float* kr = keys + (long long)r * c;
    int nkept = 0;
    for (int j = 0; j < c; ++j) {
        int vj = cr[j];
        bool keep = vj >= 0;
        if (keep) {
            float kj = kr[j];
            bool occluded = false;
            for (int b = 0; b < nkept && !occluded; b += 32) {
                bool mine = false;
                if (b + lane < nkept) {
                    int i = kept[b + lane];
                    float pk = pair_key<METRIC>(table, dim, cr[i], vj);
                    // a twin of the row (l2 key 0) occludes nothing (cpu/prune.py says why)
                    mine = (METRIC != 0 || kr[i] > 0.f)
                           && (RULE == 0 ? pk <= kj : rule_less<METRIC>(kr[i], kj, alpha) && rule_less<METRIC>(pk, kj, alpha));
                }
                occluded = __any_sync(FULL_MASK, mine);
            }
            keep = !occluded;
        }
        if (lane == 0) out[(long long)r * c + j] = keep ? 1 : 0;
        if (keep) {
            if (lane == 0) kept[nkept] = j;
            __syncwarp();
            ++nkept;
        }
    }
}

// TSDG §3.3: each candidate's occlusion factor, the candidates i (all, kept or not) with d(row, i) < d(row, j)
// and d(i, j) < d(row, j); 0 for empty slots. A lane per i, the warp's counts summed.
template <int METRIC>
__global__ void __launch_bounds__(128) diversify_occlusion(const float* __restrict__ table, int dim,
        const int* __restrict__ cands, const float* __restrict__ keys, int rows, int c, int* __restrict__ out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    const int* cr = cands + (long long)r * c;
    const float* kr = keys + (long long)r * c;
    for (int j = 0; j < c; ++j) {
        int vj = cr[j];
        int count = 0;
        if (vj >= 0) {
            float kj = kr[j];
            for (int i = lane; i < c; i += 32) {
                int vi = cr[i];
                if (i == j || vi < 0 || !rule_less<METRIC>(kr[i], kj, 1.f) || (METRIC == 0 && !(kr[i] > 0.f))) continue;
                count += rule_less<METRIC>(pair_key<METRIC>(table, dim, vi, vj), kj, 1.f);
            }
        }
        for (int off = 16; off > 0; off >>= 1) count += __shfl_xor_sync(FULL_MASK, count, off);
        if (lane == 0) out[(long long)r * c + j] = count;
    }
}
