// GGM set-up and fold-back (GNND paper §5.1); the descent between them is GNND's (gnnd.cu, cross.cu)
// in cross-shard mode. Follows common.cuh in the source compile.py builds.

// ---------------------------------------------------------------------------------------------
// GGM (GNND paper §5.1, Alg. 3). Shards a and b share one local index space: rows of a are [0, na), rows
// of b are [na, n). Lists hold local ids during the descent and global ids (int32) outside it; an old
// list may also hold ids of other shards, which cannot be cross-matched but survive the final merge.
// ---------------------------------------------------------------------------------------------

// bitonic sort of N (power of two) (key, id, flag) triples in shared memory by one warp
__device__ void warp_bitonic_f(float* key, int* id, unsigned char* flag, int N, int lane) {
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = lane; i < (N >> 1); i += 32) {
                int lo = 2 * stride * (i / stride) + (i % stride);
                int hi = lo + stride;
                bool asc = (lo & size) == 0;
                float kl = key[lo], kh = key[hi];
                int il = id[lo], ih = id[hi];
                bool sw = asc ? kless(kh, ih, kl, il) : kless(kl, il, kh, ih);
                if (sw) {
                    key[lo] = kh; key[hi] = kl;
                    id[lo] = ih; id[hi] = il;
                    unsigned char f = flag[lo];
                    flag[lo] = flag[hi];
                    flag[hi] = f;
                }
            }
            __syncwarp();
        }
    }
}

// exact key (direct differences) between rows r and v of x, by one warp; every lane gets the result
template <typename T, int METRIC>
__device__ __forceinline__ float warp_key(const T* __restrict__ x, int r, int v, int d, int dpad, int lane) {
    const T* xr = x + (size_t)r * dpad;
    const T* xv = x + (size_t)v * dpad;
    float acc = 0.f;
    for (int e = lane; e < d; e += 32) {
        const float a = to_f(xr[e]), b = to_f(xv[e]);
        if (METRIC == 0) {
            const float df = a - b;
            acc = fmaf(df, df, acc);
        } else {
            acc = fmaf(a, b, acc);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
    return (METRIC == 0) ? acc : -acc;
}

// global id -> local id of the pair's index space (-1: outside both shards)
__device__ __forceinline__ int ggm_local(long long g, long long a_off, int na, long long b_off, int nb) {
    if (g >= a_off && g < a_off + na) return (int)(g - a_off);
    if (g >= b_off && g < b_off + nb) return (int)(g - b_off) + na;
    return -1;
}
__device__ __forceinline__ long long ggm_global(int l, long long a_off, int na, long long b_off) {
    return l < na ? a_off + l : b_off + (l - na);
}

// A warp's candidates r (one per lane, < 0: none) appended to the list I[0, total) as NEW entries, in lane
// order, skipping ids already listed or held by a lower lane, up to `want` entries; returns the new total.
__device__ __forceinline__ int warp_append_new(int r, int* I, unsigned char* F, int total, int want, int lane) {
    bool ok = r >= 0;
    for (int q = 0; q < total; ++q) ok = ok && (I[q] != r);
    for (int l = 0; l < 32; ++l) {
        const int o = __shfl_sync(FULL_MASK, r, l);
        ok = ok && !((l < lane) && (o == r));
    }
    const u32 mask = __ballot_sync(FULL_MASK, ok);
    const int pos = total + __popc(mask & ((1u << lane) - 1u));
    if (ok && pos < want) {
        I[pos] = r;
        F[pos] = 1;
    }
    __syncwarp();
    return min(want, total + __popc(mask));
}

// GGM 1: set-up, one warp per row (4 per block), w <= 128. The first `held` = w - fill entries of the row's
// old list (global ids, wo wide) that lie in a or b keep their stored keys and are flagged OLD; then `fill`
// distinct random rows of the other shard (all of its rows when it has no more than `fill`), keys computed
// exactly, flagged NEW; EMPTY padded to w and sorted by (key, id).
// Seeded merge (`seeded`, bigknn/algorithms/merge_setup.py): rows of a get no fill, and their empty slots carry the key of the
// stored list's w-th entry (their bound) instead of +inf; rows of b take their fill first from rows of a two
// hops away through the shards `vias` (n_vias <= MAX_VIAS; via q holds global rows [via_offs[q], +via_rows[q])
// and its lists, wv wide, global ids, at address via_ptrs[q]): the a-entries of the lists of the row's
// neighbours in the vias, by list position first, then by the row's own order of those neighbours.
template <typename T, int METRIC>
__global__ void __launch_bounds__(128) ggm_setup(const T* __restrict__ x, int n, int d, int dpad, int na,
                                                 long long a_off, long long b_off, const int* __restrict__ old_ids,
                                                 const float* __restrict__ old_keys, int wo, int w, int fill_n,
                                                 int seeded, const unsigned long long* __restrict__ via_ptrs,
                                                 const long long* __restrict__ via_offs,
                                                 const int* __restrict__ via_rows, int n_vias, int wv,
                                                 u64 seed, int* __restrict__ ids,
                                                 float* __restrict__ keys, unsigned char* __restrict__ flags) {
    __shared__ float skey[4][128];
    __shared__ int sid[4][128];
    __shared__ unsigned char sflag[4][128];
    __shared__ int svia[4][128];
    __shared__ unsigned char sviaq[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= n) return;
    float* K = skey[warp];
    int* I = sid[warp];
    unsigned char* F = sflag[warp];
    const int nb = n - na;
    const u32 lt = (1u << lane) - 1u;
    const bool in_a = row < na;
    const int fill = (seeded && in_a) ? 0 : fill_n;
    const int held = w - fill;

    // held part: in-pair entries of the old list, in list order (ascending keys)
    int count = 0;
    for (int base = 0; base < wo && count < held; base += 32) {
        const int j = base + lane;
        int loc = -1;
        float kv = INF_F;
        if (j < wo) {
            const int g = old_ids[(size_t)row * wo + j];
            if (g >= 0) {
                loc = ggm_local(g, a_off, na, b_off, nb);
                kv = old_keys[(size_t)row * wo + j];
            }
        }
        const bool ok = loc >= 0 && loc != row;
        const u32 mask = __ballot_sync(FULL_MASK, ok);
        const int pos = count + __popc(mask & lt);
        if (ok && pos < held) {
            I[pos] = loc;
            K[pos] = kv;
            F[pos] = 0;
        }
        count = min(held, count + __popc(mask));
    }
    __syncwarp();
    const int want = min(count + fill, w);
    int total = count;

    // seeds two hops away through via (rows of b in a seeded merge)
    if (seeded && !in_a) {
        int* V = svia[warp];
        unsigned char* VQ = sviaq[warp];
        int nt = 0;
        for (int base = 0; base < wo; base += 32) {
            const int j = base + lane;
            int t = -1, vq = 0;
            if (j < wo) {
                const long long g = old_ids[(size_t)row * wo + j];
                for (int q = 0; q < n_vias && t < 0; ++q)
                    if (g >= via_offs[q] && g < via_offs[q] + via_rows[q]) {
                        t = (int)(g - via_offs[q]);
                        vq = q;
                    }
            }
            const u32 mask = __ballot_sync(FULL_MASK, t >= 0);
            if (t >= 0) {
                V[nt + __popc(mask & lt)] = t;
                VQ[nt + __popc(mask & lt)] = (unsigned char)vq;
            }
            nt += __popc(mask);
        }
        __syncwarp();
        for (int j = 0; j < wv && total < want; ++j) {
            for (int q0 = 0; q0 < nt && total < want; q0 += 32) {
                const int q = q0 + lane;
                int r = -1;
                if (q < nt) {
                    const int* list = reinterpret_cast<const int*>(via_ptrs[VQ[q]]);
                    const long long h = list[(size_t)V[q] * wv + j];
                    if (h >= a_off && h < a_off + na) r = (int)(h - a_off);
                }
                total = warp_append_new(r, I, F, total, want, lane);
            }
        }
    }

    // random fill from the other shard
    const int lo = row < na ? na : 0;
    const int other = row < na ? nb : na;
    if (other <= fill) {
        for (int base = 0; base < other && total < want; base += 32) {
            const int j = base + lane;
            total = warp_append_new(j < other ? lo + j : -1, I, F, total, want, lane);
        }
    } else {
        const u64 base64 = mix64(seed ^ (0xD1B54A32D192ED03ull * (u64)(row + 1)));
        for (int attempt = 0; total < want && attempt < 64; ++attempt) {
            const u64 r64 = mix64(base64 + (u64)attempt * 32u + (u64)lane);
            total = warp_append_new(lo + (int)(r64 % (u64)other), I, F, total, want, lane);
        }
    }
    __syncwarp();
    for (int j = count; j < total; ++j) {
        const float kv = warp_key<T, METRIC>(x, row, I[j], d, dpad, lane);
        if (lane == 0) K[j] = kv;
    }
    const float bound = (seeded && in_a && wo >= w) ? old_keys[(size_t)row * wo + w - 1] : INF_F;
    const int KP = next_pow2(w);
    for (int j = total + lane; j < KP; j += 32) {
        K[j] = j < w ? bound : INF_F;
        I[j] = -1;
        F[j] = 0;
    }
    __syncwarp();
    warp_bitonic_f(K, I, F, KP, lane);
    for (int j = lane; j < w; j += 32) {
        ids[(size_t)row * w + j] = I[j];
        keys[(size_t)row * w + j] = K[j];
        flags[(size_t)row * w + j] = F[j];
    }
}

// GGM 3: fold back, one warp per row (4 per block), w, wo <= 128. The row's whole old list (global ids,
// stored keys) plus the refined entries (local ids) whose global id is not in it, keys recomputed exactly
// (the descent may have kept norm-expansion keys); sorted by (key, id); the first w go to out with global
// ids, EMPTY / +inf padded.
template <typename T, int METRIC>
__global__ void __launch_bounds__(128) ggm_finish(const T* __restrict__ x, int n, int d, int dpad, int na,
                                                  long long a_off, long long b_off, const int* __restrict__ ids,
                                                  int w, const int* __restrict__ old_ids,
                                                  const float* __restrict__ old_keys, int wo,
                                                  int* __restrict__ out_ids, float* __restrict__ out_keys) {
    __shared__ float skey[4][256];
    __shared__ int sid[4][256];
    __shared__ int sloc[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= n) return;
    float* K = skey[warp];
    int* I = sid[warp];
    int* L = sloc[warp];
    const u32 lt = (1u << lane) - 1u;
    const long long self = ggm_global(row, a_off, na, b_off);
    for (int j = lane; j < wo; j += 32) {
        int g = old_ids[(size_t)row * wo + j];
        float kv = old_keys[(size_t)row * wo + j];
        if (g < 0 || (long long)g == self) {
            g = -1;
            kv = INF_F;
        }
        I[j] = g;
        K[j] = kv;
    }
    __syncwarp();
    int m = 0;
    for (int base = 0; base < w; base += 32) {
        const int j = base + lane;
        const int loc = j < w ? ids[(size_t)row * w + j] : -1;
        bool ok = loc >= 0 && loc < n && loc != row;
        int g = -1;
        if (ok) {
            g = (int)ggm_global(loc, a_off, na, b_off);
            for (int q = 0; q < wo; ++q)
                if (I[q] == g) {
                    ok = false;
                    break;
                }
        }
        const u32 mask = __ballot_sync(FULL_MASK, ok);
        const int pos = m + __popc(mask & lt);
        if (ok) {
            L[pos] = loc;
            I[wo + pos] = g;
        }
        m += __popc(mask);
    }
    __syncwarp();
    for (int j = 0; j < m; ++j) {
        const float kv = warp_key<T, METRIC>(x, row, L[j], d, dpad, lane);
        if (lane == 0) K[wo + j] = kv;
    }
    const int tot = wo + m;
    const int KP = next_pow2(tot);
    for (int j = tot + lane; j < KP; j += 32) {
        K[j] = INF_F;
        I[j] = -1;
    }
    __syncwarp();
    warp_bitonic(K, I, KP, lane);
    for (int j = lane; j < w; j += 32) {
        const bool v = j < tot && K[j] < INF_F;
        out_ids[(size_t)row * w + j] = v ? I[j] : -1;
        out_keys[(size_t)row * w + j] = v ? K[j] : INF_F;
    }
}
