// bigknn CUDA kernels: GNND (GNND paper §4) and exact k-NN selection.
//
// Compiled at run time by cupy.RawModule (NVRTC); no headers are included so that the source builds
// with NVRTC alone. Templates are instantiated through name_expressions from backend.py.
//
// Conventions shared with bigknn/graph.py:
//   ids (n, k) int32, keys (n, k) float32 ascending per row, ties ordered by id (unsigned, so the
//   empty id -1 sorts last); NEW flag = 1, OLD flag = 0 (uint8).
//   METRIC 0 = l2 (key = squared L2), METRIC 1 = ip (key = -dot). All arithmetic in float32.
//   Element types: float, unsigned short (IEEE half bits), unsigned char, signed char.

#define FULL_MASK 0xffffffffu
#ifndef GNND_MODE
#define GNND_MODE 0  // diagnostics only: 1 = cross-match emits nothing, 2 = also skips the distance loop
#endif
#ifndef GNND_GUNR
#define GNND_GUNR 0  // loads in flight per thread in the cross-match gather (0: by block size)
#endif
#define INF_F __int_as_float(0x7f800000)

typedef unsigned long long u64;
typedef unsigned int u32;

// ---------------------------------------------------------------------------------------------
// element conversion
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(unsigned short v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}
__device__ __forceinline__ float to_f(unsigned char v) { return (float)v; }
__device__ __forceinline__ float to_f(signed char v) { return (float)v; }

template <typename T> struct VecInfo;
template <> struct VecInfo<float> { static const int VE = 4; };
template <> struct VecInfo<unsigned short> { static const int VE = 8; };
template <> struct VecInfo<unsigned char> { static const int VE = 16; };
template <> struct VecInfo<signed char> { static const int VE = 16; };

// one 16-byte unit of a row -> VE floats in shared memory (dst 16-byte aligned): the load and the
// conversion are split so that a thread can keep several loads in flight before it stores
__device__ __forceinline__ uint4 unit_load(const void* src) { return __ldg(reinterpret_cast<const uint4*>(src)); }

template <typename T> __device__ __forceinline__ void unit_put(uint4 u, float* dst);
template <> __device__ __forceinline__ void unit_put<float>(uint4 u, float* dst) {
    *reinterpret_cast<float4*>(dst) =
        make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}
template <> __device__ __forceinline__ void unit_put<unsigned short>(uint4 u, float* dst) {
    u32 w[4] = {u.x, u.y, u.z, u.w};
    float o[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[2 * i] = to_f((unsigned short)(w[i] & 0xffffu));
        o[2 * i + 1] = to_f((unsigned short)(w[i] >> 16));
    }
    float4* d4 = reinterpret_cast<float4*>(dst);
    d4[0] = make_float4(o[0], o[1], o[2], o[3]);
    d4[1] = make_float4(o[4], o[5], o[6], o[7]);
}
template <> __device__ __forceinline__ void unit_put<unsigned char>(uint4 u, float* dst) {
    u32 w[4] = {u.x, u.y, u.z, u.w};
    float4* d4 = reinterpret_cast<float4*>(dst);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        d4[i] = make_float4((float)(w[i] & 0xffu), (float)((w[i] >> 8) & 0xffu),
                            (float)((w[i] >> 16) & 0xffu), (float)(w[i] >> 24));
}
template <> __device__ __forceinline__ void unit_put<signed char>(uint4 u, float* dst) {
    u32 w[4] = {u.x, u.y, u.z, u.w};
    float4* d4 = reinterpret_cast<float4*>(dst);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        d4[i] = make_float4((float)(signed char)(w[i] & 0xffu), (float)(signed char)((w[i] >> 8) & 0xffu),
                            (float)(signed char)((w[i] >> 16) & 0xffu), (float)(signed char)(w[i] >> 24));
}

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// float <-> uint32 whose unsigned order is the float order
__device__ __forceinline__ u32 f2s(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float s2f(u32 s) {
    u32 b = (s & 0x80000000u) ? (s & 0x7fffffffu) : ~s;
    return __uint_as_float(b);
}

// total order on (key, id); id compared unsigned so that the empty id -1 sorts last among equal keys
__device__ __forceinline__ bool kless(float ka, int ia, float kb, int ib) {
    return ka < kb || (ka == kb && (u32)ia < (u32)ib);
}

__device__ __forceinline__ int next_pow2(int v) {
    int p = 1;
    while (p < v) p <<= 1;
    return p;
}

// bitonic sort of N (power of two) (key, id) pairs in shared memory by one warp
__device__ void warp_bitonic(float* key, int* id, int N, int lane) {
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
                }
            }
            __syncwarp();
        }
    }
}

// same, by the whole block (all threads must call it)
__device__ void block_bitonic(float* key, int* id, int N) {
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < (N >> 1); i += blockDim.x) {
                int lo = 2 * stride * (i / stride) + (i % stride);
                int hi = lo + stride;
                bool asc = (lo & size) == 0;
                float kl = key[lo], kh = key[hi];
                int il = id[lo], ih = id[hi];
                bool sw = asc ? kless(kh, ih, kl, il) : kless(kl, il, kh, ih);
                if (sw) {
                    key[lo] = kh; key[hi] = kl;
                    id[lo] = ih; id[hi] = il;
                }
            }
            __syncthreads();
        }
    }
}

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
                                                 unsigned char* __restrict__ flags) {
    __shared__ float skey[4][128];
    __shared__ int sid[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= n) return;
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
                                                     int* __restrict__ ids, float* __restrict__ keys) {
    __shared__ float skey[4][128];
    __shared__ int sid[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= n) return;
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
__global__ void gnnd_norms(const T* __restrict__ x, int n, int d, int dpad, float* __restrict__ out) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= n) return;
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
// Seeded merge (`seeded`, bigknn/ggm.py): rows of a get no fill, and their empty slots carry the key of the
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
                                                              int use_labels) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= n) return;
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
                                        int* __restrict__ cnt) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * p) return;
    const int row = (int)(t / p), j = (int)(t % p);
    const int S2 = 2 * p;
    if (j < cnt[2 * n + row]) {
        const int v = new_s[(size_t)row * S2 + j];
        const int pos = atomicAdd(&cnt[v], 1);
        if (pos < S2) new_s[(size_t)v * S2 + pos] = row;
    }
    if (j < cnt[3 * n + row]) {
        const int v = old_s[(size_t)row * S2 + j];
        const int pos = atomicAdd(&cnt[n + v], 1);
        if (pos < S2) old_s[(size_t)v * S2 + pos] = row;
    }
}

// candidate table: per target row C = 2^logC slots; slot chosen by a hash of the neighbour id and
// the best (key, id) kept with a 64-bit atomicMin (lock-free; the same id always lands in the same slot)
#define MAX_SLOTS 128  // largest candidate table per row (logC <= 7); gnnd_merge stages one in shared memory
__device__ __forceinline__ void emit_candidate(int u, int v, float key, const float* __restrict__ keys, int k,
                                               u64* __restrict__ cand, int logC) {
    if (GNND_MODE != 0) return;
    if (!(key < keys[(size_t)u * k + (k - 1)])) return;
    const u32 slot = ((u32)v * 2654435761u) >> (32 - logC);
    const u64 packed = ((u64)f2s(key) << 32) | (u64)(u32)v;
    atomicMin(&cand[((size_t)u << logC) + slot], packed);
}

// ---------------------------------------------------------------------------------------------
// GNND 4: cross-matching, one block per list. Samples are packed: NEW in slots [0, nn), OLD in
// [nn, nn + no) (nn, no <= 2p <= MAXN). Distances NEW x (NEW u OLD) are computed as a register-tiled
// rectangle (TR x TC per thread, rows a + RT r, columns b + CT c), dims streamed through shared memory
// in chunks of DCMAX floats; row / column groups past nn / nn + no are skipped (block-uniform branches).
// Selective update: each NEW sample proposes its nearest other NEW and its nearest OLD, each OLD sample
// its nearest NEW. With labels, pairs of equal label are skipped (GGM).
// CROSS (GGM, with gnnd_sample's cross-shard mode): NEW and OLD samples lie in different shards, so only
// the NEW x OLD block is computed (columns start at nn; about half the distance loop) and NEW x NEW is
// never proposed.
// ---------------------------------------------------------------------------------------------
// MMA (T = half bits, a dot-product key: METRIC 1 or EXPAND, MAXN >= 16): the distance tile runs on tensor
// cores (mma.sync m16n8k16, fp16 in, fp32 accumulate: the products and sums the FMA loop computes, in another
// order). The rows stay halves in shared memory (chunks of 2 * DCMAX dims, the same bytes); each warp owns
// 16 x 8 tiles of NEW x (NEW u OLD), and writes its accumulators straight into the distance matrix.
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename T, int METRIC, int EXPAND, int MAXN, int TR, int TC, int DCMAX, int CROSS, int MMA>
__global__ void __launch_bounds__((MAXN / TR) * (2 * MAXN / TC), ((MAXN / TR) * (2 * MAXN / TC)) >= 512 ? 1 : 6)
gnnd_cross(const T* __restrict__ x, int n, int dpad, int k, int p, const int* __restrict__ new_s,
           const int* __restrict__ old_s, const int* __restrict__ cnt, const float* __restrict__ keys,
           const int* __restrict__ labels, int use_labels, u64* __restrict__ cand, int logC,
           const float* __restrict__ norms) {
    // EXPAND (l2 only): key = |a|^2 + |b|^2 - 2 a.b, one FMA per dim instead of a subtraction and an FMA;
    // the keys kept in the lists are made exact afterwards by gnnd_finalize
    constexpr int M2 = 2 * MAXN;
    constexpr int RT = MAXN / TR;
    constexpr int CT = M2 / TC;
    constexpr int NT = RT * CT;
    constexpr int RS = DCMAX + 4;  // shared row stride (floats); RS/4 odd -> conflict-free float4 reads
    constexpr int DS = M2 + 1;     // distance matrix row stride (odd)
    constexpr int SH_A = M2 * RS;
    constexpr int SH_B = MAXN * DS;
    constexpr int SH = SH_A > SH_B ? SH_A : SH_B;
    constexpr int VE = VecInfo<T>::VE;
    constexpr int CH = MMA ? 2 * DCMAX : DCMAX;  // dims per chunk (MMA: halves, 2 per float of the buffer)
    constexpr int NW = NT / 32;
    constexpr int MT = MMA ? MAXN / 16 : 1;                  // 16-row tiles of NEW samples
    constexpr int NTL = MMA ? (CROSS ? MAXN : M2) / 8 : 1;  // 8-column tiles
    constexpr int TPW = (MT * NTL + NW - 1) / NW;          // tiles per warp
    static_assert(!MMA || (sizeof(T) == 2 && MAXN >= 16 && (METRIC == 1 || EXPAND)), "MMA: halves, dot keys");
    __shared__ __align__(16) float sh[SH];
    __shared__ int sids[M2];
    __shared__ int slab[M2];
    __shared__ float snorm[M2];

    const int row = blockIdx.x, t = threadIdx.x;
    const int S2 = 2 * p;
    const int nn = min(cnt[row], S2);
    const int no = min(cnt[n + row], S2);
    if (nn == 0 || (CROSS && no == 0)) return;  // block-uniform: nothing to match
    const int mm = nn + no;

    if (t < M2) {
        int id = -1;
        if (t < nn) id = new_s[(size_t)row * S2 + t];
        else if (t < mm) id = old_s[(size_t)row * S2 + (t - nn)];
        sids[t] = id;
    }
    __syncthreads();
    int myid = -1;
    if (t < M2) {
        myid = sids[t];
        if (myid >= 0) {
            // duplicates: a NEW sample seen earlier, an OLD sample also NEW or seen earlier
            for (int j = 0; j < t; ++j)
                if (sids[j] == myid) {
                    myid = -1;
                    break;
                }
        }
    }
    __syncthreads();
    if (t < M2) {
        sids[t] = myid;
        slab[t] = (use_labels && myid >= 0) ? labels[myid] : 0;
        if (EXPAND) snorm[t] = myid >= 0 ? norms[myid] : 0.f;
    }
    __syncthreads();

    const int a = t / CT, b = t % CT;
    const int rv = (nn + RT - 1) / RT;  // row groups holding NEW samples (block-uniform)
    // column groups: any sample, or (CROSS) the OLD samples only, columns shifted by nn; MAXN is a
    // multiple of CT, so coff + cv * CT <= nn + MAXN <= M2
    const int coff = CROSS ? nn : 0;
    const int cv = ((CROSS ? no : mm) + CT - 1) / CT;
    const bool active = a < nn;
    float acc[TR][TC];
#pragma unroll
    for (int r = 0; r < TR; ++r)
#pragma unroll
        for (int c = 0; c < TC; ++c) acc[r][c] = 0.f;
    const int warp = t >> 5, g = (t & 31) >> 2, tq = t & 3;
    float frag[TPW][4];
#pragma unroll
    for (int q = 0; q < TPW; ++q) frag[q][0] = frag[q][1] = frag[q][2] = frag[q][3] = 0.f;

    for (int c0 = 0; c0 < dpad; c0 += CH) {
        const int clen = min(CH, dpad - c0);
        const int upr = clen / VE;
        const int total = mm * upr;
        // gather: GUNR independent 16-byte loads in flight per thread before the shared stores (the rows
        // are random, so this loop is latency-bound)
        constexpr int GUNR = GNND_GUNR > 0 ? GNND_GUNR : (NT >= 512 ? 2 : 4);
        for (int u0 = t; u0 < total; u0 += NT * GUNR) {
            uint4 buf[GUNR];
            int dst[GUNR];
#pragma unroll
            for (int q = 0; q < GUNR; ++q) {
                const int u = u0 + q * NT;
                dst[q] = -1;
                if (u < total) {
                    const int r = u / upr, cu = u - r * upr;
                    const int id = sids[r];
                    if (id >= 0) {
                        buf[q] = unit_load(x + (size_t)id * dpad + c0 + cu * VE);
                        dst[q] = r * RS + cu * (MMA ? VE / 2 : VE);  // MMA: halves, two a word
                    }
                }
            }
#pragma unroll
            for (int q = 0; q < GUNR; ++q) {
                if (dst[q] < 0) continue;
                if (MMA) *reinterpret_cast<uint4*>(&sh[dst[q]]) = buf[q];  // halves stay halves
                else unit_put<T>(buf[q], &sh[dst[q]]);
            }
        }
        const int clen16 = (clen + 15) & ~15;  // MMA steps 16 dims: zero the tail of a last chunk of 8k dims
        if (MMA && clen16 != clen)
            for (int r = t; r < M2; r += NT) *reinterpret_cast<uint4*>(&sh[r * RS + clen / 2]) = make_uint4(0, 0, 0, 0);
        __syncthreads();
        if (MMA && GNND_MODE != 2) {
            const u32* shw = reinterpret_cast<const u32*>(sh);
#pragma unroll
            for (int q = 0; q < TPW; ++q) {
                const int tile = warp + NW * q;
                const int r0 = (tile % MT) * 16, j0 = coff + (tile / MT) * 8;
                if (tile >= MT * NTL || r0 >= nn || j0 >= mm) continue;  // warp-uniform
                const u32* ar = shw + (r0 + g) * RS + tq;
                const u32* br = shw + (j0 + g) * RS + tq;
                for (int kw = 0; kw < clen16 / 2; kw += 8) {  // 16 dims = 8 words
                    const u32 av[4] = {ar[kw], ar[8 * RS + kw], ar[kw + 4], ar[8 * RS + kw + 4]};
                    const u32 bv[2] = {br[kw], br[kw + 4]};
                    mma_16816(frag[q], av, bv);
                }
            }
        } else if (!MMA && active && GNND_MODE != 2) {
            for (int dd = 0; dd < clen; dd += 4) {
                float4 av[TR], bv[TC];
#pragma unroll
                for (int r = 0; r < TR; ++r)
                    if (r < rv) av[r] = *reinterpret_cast<const float4*>(&sh[(a + RT * r) * RS + dd]);
#pragma unroll
                for (int c = 0; c < TC; ++c)
                    if (c < cv) bv[c] = *reinterpret_cast<const float4*>(&sh[(coff + b + CT * c) * RS + dd]);
#pragma unroll
                for (int r = 0; r < TR; ++r) {
                    if (r >= rv) continue;
#pragma unroll
                    for (int c = 0; c < TC; ++c) {
                        if (c >= cv) continue;
                        if (METRIC == 0 && !EXPAND) {
                            float e;
                            e = av[r].x - bv[c].x; acc[r][c] = fmaf(e, e, acc[r][c]);
                            e = av[r].y - bv[c].y; acc[r][c] = fmaf(e, e, acc[r][c]);
                            e = av[r].z - bv[c].z; acc[r][c] = fmaf(e, e, acc[r][c]);
                            e = av[r].w - bv[c].w; acc[r][c] = fmaf(e, e, acc[r][c]);
                        } else {
                            acc[r][c] = fmaf(av[r].x, bv[c].x, acc[r][c]);
                            acc[r][c] = fmaf(av[r].y, bv[c].y, acc[r][c]);
                            acc[r][c] = fmaf(av[r].z, bv[c].z, acc[r][c]);
                            acc[r][c] = fmaf(av[r].w, bv[c].w, acc[r][c]);
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

    // distance matrix D[i][j], i NEW slot, j any slot (reuses the vector buffer); rows >= nn and
    // columns >= nn + no hold ids -1 and become +inf
    auto put = [&](int i, int j, float dot) {
        bool ok = sids[i] >= 0 && sids[j] >= 0 && i != j;
        if (use_labels && ok) ok = slab[i] != slab[j];
        float v;
        if (METRIC == 1) v = -dot;
        else if (EXPAND) v = fmaxf(fmaf(-2.f, dot, snorm[i] + snorm[j]), 0.f);
        else v = dot;
        sh[i * DS + j] = ok ? v : INF_F;
    };
    if (MMA) {
#pragma unroll
        for (int q = 0; q < TPW; ++q) {
            const int tile = warp + NW * q;
            const int r0 = (tile % MT) * 16, j0 = coff + (tile / MT) * 8;
            if (tile >= MT * NTL || r0 >= nn || j0 >= mm) continue;
#pragma unroll
            for (int h = 0; h < 4; ++h) put(r0 + g + (h >> 1) * 8, j0 + 2 * tq + (h & 1), frag[q][h]);
        }
    } else {
#pragma unroll
        for (int r = 0; r < TR; ++r)
#pragma unroll
            for (int c = 0; c < TC; ++c) {
                const int i = a + RT * r, j = coff + b + CT * c;
                if (CROSS && j >= M2) continue;
                put(i, j, acc[r][c]);
            }
    }
    __syncthreads();

    if (t < nn) {
        const int id = sids[t];
        if (id >= 0) {
            float bn = INF_F, bo = INF_F;
            int jn = -1, jo = -1;
            if (!CROSS)
                for (int j = 0; j < nn; ++j) {
                    const float v = sh[t * DS + j];
                    if (v < bn) { bn = v; jn = j; }
                }
            for (int j = nn; j < mm; ++j) {
                const float v = sh[t * DS + j];
                if (v < bo) { bo = v; jo = j; }
            }
            if (jn >= 0) emit_candidate(id, sids[jn], bn, keys, k, cand, logC);
            if (jo >= 0) emit_candidate(id, sids[jo], bo, keys, k, cand, logC);
        }
    } else if (t < mm) {
        const int id = sids[t];
        if (id >= 0) {
            float bb = INF_F;
            int ib = -1;
            for (int i = 0; i < nn; ++i) {
                const float v = sh[i * DS + t];
                if (v < bb) { bb = v; ib = i; }
            }
            if (ib >= 0) emit_candidate(id, sids[ib], bb, keys, k, cand, logC);
        }
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
                                                             unsigned long long* __restrict__ updates) {
    __shared__ float lk[4][128];
    __shared__ int li[4][128];
    __shared__ unsigned char lf[4][128];
    __shared__ float ck[4][MAX_SLOTS];
    __shared__ int ci[4][MAX_SLOTS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= n) return;
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
    if (lane == 0 && ins) atomicAdd(updates, (unsigned long long)ins);
}

// ---------------------------------------------------------------------------------------------
// Exact k-NN: running top-k over a tile of dot products S (qb x ncols, row-major) from cuBLAS.
// One block (256 threads) per query; the tile is read in pieces of 4096 columns: keys below the
// current k-th best are appended to a shared buffer, then buffer + current top-k are bitonic-sorted.
// key: l2 -> |q|^2 + |b|^2 - 2 q.b (clamped at 0; the kept keys are recomputed exactly per block); ip -> -q.b.
// ---------------------------------------------------------------------------------------------
template <int METRIC>
__global__ void __launch_bounds__(256) knn_select(const float* __restrict__ S, int ncols,
                                                  const float* __restrict__ bnorm, const float* __restrict__ qnorm,
                                                  long long col_base, int k,
                                                  float* __restrict__ tk, int* __restrict__ ti, int q0) {
    __shared__ float bk[4096];
    __shared__ int bi[4096];
    __shared__ float ckey[128];
    __shared__ int cid[128];
    __shared__ int cntp;
    __shared__ float tau_s;
    const int t = threadIdx.x, lane = t & 31;
    const int qr = blockIdx.x;
    const size_t q = (size_t)q0 + qr;
    const float* Srow = S + (size_t)qr * ncols;
    const u32 lt = (1u << lane) - 1u;
    for (int j = t; j < k; j += blockDim.x) {
        ckey[j] = tk[q * k + j];
        cid[j] = ti[q * k + j];
    }
    __syncthreads();
    if (t == 0) {
        float mx = -INF_F;
        for (int j = 0; j < k; ++j) mx = fmaxf(mx, ckey[j]);
        tau_s = mx;
    }
    __syncthreads();
    float tau = tau_s;
    // l2 keys carry |q|^2 so that they compare with the exact keys kept from earlier blocks
    const float qn = (METRIC == 0) ? qnorm[q] : 0.f;
    for (int p0 = 0; p0 < ncols; p0 += 4096) {
        const int plen = min(4096, ncols - p0);
        if (t == 0) cntp = 0;
        __syncthreads();
        for (int e0 = 0; e0 < plen; e0 += blockDim.x) {
            const int e = e0 + t;
            float key = INF_F;
            bool pass = false;
            if (e < plen) {
                const float s = Srow[p0 + e];
                key = (METRIC == 0) ? fmaxf(fmaf(-2.f, s, bnorm[p0 + e] + qn), 0.f) : -s;
                pass = key < tau;
            }
            const u32 mask = __ballot_sync(FULL_MASK, pass);
            int wbase = 0;
            if (lane == 0 && mask) wbase = atomicAdd(&cntp, __popc(mask));
            wbase = __shfl_sync(FULL_MASK, wbase, 0);
            if (pass) {
                const int pos = wbase + __popc(mask & lt);
                bk[pos] = key;
                bi[pos] = (int)(col_base + p0 + e);
            }
        }
        __syncthreads();
        const int c = cntp;
        __syncthreads();       // everyone has read cntp before thread 0 resets it
        if (c == 0) continue;  // block-uniform
        if (c + k <= 4096) {
            for (int j = t; j < k; j += blockDim.x) {
                bk[c + j] = ckey[j];
                bi[c + j] = cid[j];
            }
            const int tot = c + k;
            const int N = next_pow2(tot);
            for (int j = tot + t; j < N; j += blockDim.x) {
                bk[j] = INF_F;
                bi[j] = -1;
            }
            __syncthreads();
            block_bitonic(bk, bi, N);
        } else {
            const int N = next_pow2(c);
            for (int j = c + t; j < N; j += blockDim.x) {
                bk[j] = INF_F;
                bi[j] = -1;
            }
            __syncthreads();
            block_bitonic(bk, bi, N);
            for (int j = t; j < k; j += blockDim.x) {
                bk[k + j] = ckey[j];
                bi[k + j] = cid[j];
            }
            const int N2 = next_pow2(2 * k);
            for (int j = 2 * k + t; j < N2; j += blockDim.x) {
                bk[j] = INF_F;
                bi[j] = -1;
            }
            __syncthreads();
            block_bitonic(bk, bi, N2);
        }
        for (int j = t; j < k; j += blockDim.x) {
            ckey[j] = bk[j];
            cid[j] = bi[j];
        }
        __syncthreads();
        tau = ckey[k - 1];
        __syncthreads();
    }
    for (int j = t; j < k; j += blockDim.x) {
        tk[q * k + j] = ckey[j];
        ti[q * k + j] = cid[j];
    }
}

// Exact keys for the top-k entries that point into the block [offset, offset + rows): one warp per
// (query, slot). Q (nq x d) and B (rows x d) are float32, row-major.
template <int METRIC>
__global__ void knn_exact_keys(const float* __restrict__ Q, int nq, const float* __restrict__ B, int rows, int d,
                               long long offset, int k, const int* __restrict__ ti, float* __restrict__ tk) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (long long)nq * k) return;
    const long long id = ti[w];
    if (id < offset || id >= offset + rows) return;
    const size_t q = (size_t)(w / k);
    const float* qa = Q + q * d;
    const float* bb = B + (size_t)(id - offset) * d;
    float acc = 0.f;
    for (int e = lane; e < d; e += 32) {
        const float u = qa[e], v = bb[e];
        if (METRIC == 0) {
            const float df = u - v;
            acc = fmaf(df, df, acc);
        } else {
            acc = fmaf(u, v, acc);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
    if (lane == 0) tk[w] = (METRIC == 0) ? acc : -acc;
}
