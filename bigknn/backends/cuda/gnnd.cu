// GNND (GNND paper §4) on one graph: random start, sampling, reverse samples, merging the candidate
// table into the lists, exact keys at the end. The cross-match is in cross.cu. Follows common.cuh
// in the source compile.py builds.
// Every kernel works on the rows [row0, row0 + rows) of the n (its grid sized for those): one launch over all n
// on one GPU, or a launch per GPU over its part where the arrays span GPUs (spanning.py); reads and the
// reverse samples' and candidates' atomics reach any row.

// exact keys of row `row` to the k ids in I (shared, per warp) into K, then (key, id) sort of both;
// K and I must hold next_pow2(k) slots
template <typename T, int METRIC>
__device__ void warp_keys_sort(const T* __restrict__ x, int row, int d, int dpad, int k, int* I, float* K, int lane) {
    const T* xr = x + (size_t)row * dpad;
    for (int j = 0; j < k; ++j) {
        const int v = I[j];
        float acc = 0.f;
        if (v >= 0) {
            const T* xv = x + (size_t)v * dpad;
            for (int e = lane; e < d; e += 32) {
                const float a = to_f(xr[e]), b = to_f(xv[e]);
                if (METRIC == 0) {
                    const float df = a - b;
                    acc = fmaf(df, df, acc);
                } else {
                    acc = fmaf(a, b, acc);
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
        if (lane == 0) K[j] = v < 0 ? INF_F : ((METRIC == 0) ? acc : -acc);
    }
    const int KP = next_pow2(k);
    for (int j = k + lane; j < KP; j += 32) {
        K[j] = INF_F;
        I[j] = -1;
    }
    __syncwarp();
    warp_bitonic(K, I, KP, lane);
}

// ---------------------------------------------------------------------------------------------
// GNND 1: random initialisation. One warp per row: k distinct random ids != row (requires n-1 >= k),
// keys computed, sorted by (key, id), all flagged NEW. 4 warps per block, k <= 128.
// ---------------------------------------------------------------------------------------------
template <typename T, int METRIC>
__global__ void __launch_bounds__(128) gnnd_init(const T* __restrict__ x, int n, int d, int dpad, int k,
                                                 u64 seed, int* __restrict__ ids, float* __restrict__ keys,
                                                 unsigned char* __restrict__ flags, int row0, int rows) {
    __shared__ float skey[4][128];
    __shared__ int sid[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = row0 + blockIdx.x * 4 + warp;
    if (row >= row0 + rows) return;
    float* K = skey[warp];
    int* I = sid[warp];
    const u64 m = (u64)(n - 1);
    const u64 base = mix64(seed ^ (0xD1B54A32D192ED03ull * (u64)(row + 1)));
    int count = 0;
    for (int attempt = 0; count < k; ++attempt) {
        u64 r64 = mix64(base + (u64)attempt * 32u + (u64)lane);
        int r = (int)(r64 % m);
        if (r >= row) ++r;
        bool dup = false;
        for (int j = 0; j < count; ++j) dup |= (I[j] == r);
        for (int l = 0; l < 32; ++l) {
            int o = __shfl_sync(FULL_MASK, r, l);
            dup |= (l < lane) && (o == r);
        }
        u32 mask = __ballot_sync(FULL_MASK, !dup);
        int pos = count + __popc(mask & ((1u << lane) - 1u));
        if (!dup && pos < k) I[pos] = r;
        count = min(k, count + __popc(mask));
        __syncwarp();
    }
    warp_keys_sort<T, METRIC>(x, row, d, dpad, k, I, K, lane);
    for (int j = lane; j < k; j += 32) {
        ids[(size_t)row * k + j] = I[j];
        keys[(size_t)row * k + j] = K[j];
        flags[(size_t)row * k + j] = 1;
    }
}

// GNND 6: exact keys for every list entry (direct differences), lists re-sorted by (key, id). Run after
// the iterations when the cross-match used the norm expansion for l2.
template <typename T, int METRIC>
__global__ void __launch_bounds__(128) gnnd_finalize(const T* __restrict__ x, int n, int d, int dpad, int k,
                                                     int* __restrict__ ids, float* __restrict__ keys, int row0,
                                                     int rows) {
    __shared__ float skey[4][128];
    __shared__ int sid[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = row0 + blockIdx.x * 4 + warp;
    if (row >= row0 + rows) return;
    float* K = skey[warp];
    int* I = sid[warp];
    for (int j = lane; j < k; j += 32) I[j] = ids[(size_t)row * k + j];
    __syncwarp();
    warp_keys_sort<T, METRIC>(x, row, d, dpad, k, I, K, lane);
    for (int j = lane; j < k; j += 32) {
        ids[(size_t)row * k + j] = I[j];
        keys[(size_t)row * k + j] = K[j];
    }
}

// squared norms of the rows (float32), one warp per row
template <typename T>
__global__ void gnnd_norms(const T* __restrict__ x, int n, int d, int dpad, float* __restrict__ out, int row0,
                           int rows) {
    const long long w = row0 + (((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= (long long)row0 + rows) return;
    const T* xr = x + (size_t)w * dpad;
    float acc = 0.f;
    for (int e = lane; e < d; e += 32) {
        const float a = to_f(xr[e]);
        acc = fmaf(a, a, acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
    if (lane == 0) out[w] = acc;
}

// ---------------------------------------------------------------------------------------------
// GNND 2: sampling. One warp per row: the first p NEW and the first p OLD entries in list order go
// to the forward parts of the sample lists (row stride 2p); sampled NEW entries become OLD.
// Cross-shard mode (use_labels, GGM): NEW samples only from entries whose label differs from the row's,
// OLD samples only from entries with the row's own label (as the CPU reference's _sample with `part`):
// reverse samples keep that property, so every NEW x OLD pair is cross-shard and NEW x NEW is never
// needed. NEW entries of the row's own label are left NEW and unsampled.
// cnt layout: [new_cnt | old_cnt | new_fwd | old_fwd], each n ints.
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(128) gnnd_sample(int n, int k, int p, const int* __restrict__ ids,
                                                              unsigned char* __restrict__ flags,
                                                              int* __restrict__ new_s, int* __restrict__ old_s,
                                                              int* __restrict__ cnt, const int* __restrict__ labels,
                                                              int use_labels, int row0, int rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = row0 + blockIdx.x * 4 + warp;
    if (row >= row0 + rows) return;
    const int S2 = 2 * p;
    const u32 lt = (1u << lane) - 1u;
    const int own = use_labels ? labels[row] : 0;
    int nc = 0, oc = 0;
    for (int base = 0; base < k && (nc < p || oc < p); base += 32) {
        const int j = base + lane;
        int id = -1;
        unsigned char f = 0;
        if (j < k) {
            id = ids[(size_t)row * k + j];
            f = flags[(size_t)row * k + j];
        }
        bool isn = id >= 0 && f != 0;
        bool iso = id >= 0 && f == 0;
        if (use_labels && id >= 0) {
            const bool same = labels[id] == own;
            isn = isn && !same;
            iso = iso && same;
        }
        const u32 mn = __ballot_sync(FULL_MASK, isn);
        const u32 mo = __ballot_sync(FULL_MASK, iso);
        const int rn = nc + __popc(mn & lt), ro = oc + __popc(mo & lt);
        if (isn && rn < p) {
            new_s[(size_t)row * S2 + rn] = id;
            flags[(size_t)row * k + j] = 0;
        }
        if (iso && ro < p) old_s[(size_t)row * S2 + ro] = id;
        nc += __popc(mn);
        oc += __popc(mo);
    }
    if (lane == 0) {
        const int fn = min(nc, p), fo = min(oc, p);
        cnt[row] = fn;
        cnt[n + row] = fo;
        cnt[2 * n + row] = fn;
        cnt[3 * n + row] = fo;
    }
}

// GNND 3: reverse samples, appended with atomics while the list holds fewer than 2p entries.
extern "C" __global__ void gnnd_reverse(int n, int p, int* __restrict__ new_s, int* __restrict__ old_s,
                                        int* __restrict__ cnt, int row0, int rows) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)rows * p) return;
    const int row = row0 + (int)(t / p), j = (int)(t % p);
    const int S2 = 2 * p;
    if (j < cnt[2 * n + row]) {
        const int v = new_s[(size_t)row * S2 + j];
        const int pos = GNND_ATOMIC_ADD(&cnt[v], 1);
        if (pos < S2) new_s[(size_t)v * S2 + pos] = row;
    }
    if (j < cnt[3 * n + row]) {
        const int v = old_s[(size_t)row * S2 + j];
        const int pos = GNND_ATOMIC_ADD(&cnt[n + v], 1);
        if (pos < S2) old_s[(size_t)v * S2 + pos] = row;
    }
}

// ---------------------------------------------------------------------------------------------
// GNND 5: merge the candidate table into the lists. One warp per row (k <= 128, C <= 64): drop
// candidates that are self, already listed or not better than the current worst; rank-merge the
// sorted list with the candidates; inserted entries are NEW. Resets the used slots; counts inserts.
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(128) gnnd_merge(int n, int k, int* __restrict__ ids,
                                                             float* __restrict__ keys,
                                                             unsigned char* __restrict__ flags,
                                                             u64* __restrict__ cand, int logC,
                                                             unsigned long long* __restrict__ updates, int row0,
                                                             int rows) {
    __shared__ float lk[4][128];
    __shared__ int li[4][128];
    __shared__ unsigned char lf[4][128];
    __shared__ float ck[4][MAX_SLOTS];
    __shared__ int ci[4][MAX_SLOTS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = row0 + blockIdx.x * 4 + warp;
    if (row >= row0 + rows) return;
    float* LK = lk[warp];
    int* LI = li[warp];
    unsigned char* LF = lf[warp];
    float* CK = ck[warp];
    int* CI = ci[warp];
    const size_t base = (size_t)row * k;
    const int C = 1 << logC;
    const size_t cbase = (size_t)row << logC;

    // read the candidates first: most rows have none, and then the list need not be read at all
    bool any = false;
    for (int s = lane; s < C; s += 32) any |= cand[cbase + s] != ~0ull;
    if (!__any_sync(FULL_MASK, any)) return;

    for (int j = lane; j < k; j += 32) {
        LK[j] = keys[base + j];
        LI[j] = ids[base + j];
        LF[j] = flags[base + j];
    }
    __syncwarp();
    const float worst = LK[k - 1];
    const u32 lt = (1u << lane) - 1u;
    int m = 0;
    for (int s0 = 0; s0 < C; s0 += 32) {
        const int s = s0 + lane;
        bool valid = false;
        float kc = INF_F;
        int ic = -1;
        if (s < C) {
            const u64 v = cand[cbase + s];
            if (v != ~0ull) {
                cand[cbase + s] = ~0ull;
                ic = (int)(u32)(v & 0xffffffffull);
                kc = s2f((u32)(v >> 32));
                valid = ic != row && ic >= 0 && kc < worst;
            }
        }
        if (valid) {
            for (int j = 0; j < k; ++j)
                if (LI[j] == ic) {
                    valid = false;
                    break;
                }
        }
        const u32 mask = __ballot_sync(FULL_MASK, valid);
        const int pos = m + __popc(mask & lt);
        if (valid) {
            CK[pos] = kc;
            CI[pos] = ic;
        }
        m += __popc(mask);
    }
    __syncwarp();
    if (m == 0) return;

    int ins = 0;
    for (int q = lane; q < m; q += 32) {
        const float kq = CK[q];
        const int iq = CI[q];
        int rc = 0;
        for (int r = 0; r < m; ++r) rc += kless(CK[r], CI[r], kq, iq) ? 1 : 0;
        int lo = 0, hi = k;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (kless(LK[mid], LI[mid], kq, iq)) lo = mid + 1; else hi = mid;
        }
        const int pos = rc + lo;
        if (pos < k) {
            ids[base + pos] = iq;
            keys[base + pos] = kq;
            flags[base + pos] = 1;
            ++ins;
        }
    }
    for (int j = lane; j < k; j += 32) {
        const float kj = LK[j];
        const int ij = LI[j];
        int rc = 0;
        for (int r = 0; r < m; ++r) rc += kless(CK[r], CI[r], kj, ij) ? 1 : 0;
        const int pos = j + rc;
        if (pos < k) {
            ids[base + pos] = ij;
            keys[base + pos] = kj;
            flags[base + pos] = LF[j];
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ins += __shfl_xor_sync(FULL_MASK, ins, o);
    if (lane == 0 && ins) GNND_ATOMIC_ADD(updates, (unsigned long long)ins);
}
