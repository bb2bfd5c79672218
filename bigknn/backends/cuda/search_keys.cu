// Batch graph search (TSDG §4), one warp per search: the kernels of bigknn/backends/cuda/graph_search.py, step for
// step the NumPy reference bigknn/backends/cpu/graph_search.py (its docstring states the procedures and where
// they depart from the paper). Rows are float32 (n, dim); edges (n, deg) int32 global ids, EMPTY-padded;
// occlusion factors (n, deg) uint8. Keys as everywhere: squared L2, or -dot for ip.
// This file: a row's key to a query, the batch's check of its queries, and the entry points; search.cu follows
// with the searches.



template <int METRIC>
__device__ __forceinline__ float key_term(float acc, float a, float b) {
    if (METRIC == 0) {
        float d = a - b;
        return acc + d * d;
    }
    return acc + a * b;
}

// the key terms of row v to q over dimensions first, first + stride, ... in that order; rows of a multiple of 4
// dims are read as float4 units (x from CuPy is 256-byte aligned, so every such row is 16-byte aligned)
template <int METRIC>
__device__ __forceinline__ float key_terms(const float* __restrict__ v, int dim, const float* q, int first,
                                           int stride) {
    float acc = 0.f;
    if ((dim & 3) == 0) {
        const float4* v4 = reinterpret_cast<const float4*>(v);
#pragma unroll 8
        for (int t = first; t < (dim >> 2); t += stride) {
            float4 a = __ldg(v4 + t);
            acc = key_term<METRIC>(acc, a.x, q[4 * t]);
            acc = key_term<METRIC>(acc, a.y, q[4 * t + 1]);
            acc = key_term<METRIC>(acc, a.z, q[4 * t + 2]);
            acc = key_term<METRIC>(acc, a.w, q[4 * t + 3]);
        }
    } else {
        for (int t = first; t < dim; t += stride) acc = key_term<METRIC>(acc, __ldg(v + t), q[t]);
    }
    return acc;
}

// key of row ``row`` of x to q, terms in dimension order
template <int METRIC>
__device__ __forceinline__ float row_key(const float* __restrict__ x, int dim, long long row, const float* q) {
    const float acc = key_terms<METRIC>(x + row * (long long)dim, dim, q, 0, 1);
    return METRIC == 0 ? acc : -acc;
}

// key_terms for float4 rows of at most VPL units a lane: every load of a row issued before the first is used
// (the terms in the same order, so the same keys)
template <int METRIC, int VPL>
__device__ __forceinline__ float key_terms_held(const float* __restrict__ v, int dim, const float* q, int first,
                                                int stride) {
    const float4* v4 = reinterpret_cast<const float4*>(v);
    const int units = dim >> 2;
    float4 held[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int t = first + i * stride;
        held[i] = t < units ? __ldg(v4 + t) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int t = first + i * stride;
        if (t < units) {
            acc = key_term<METRIC>(acc, held[i].x, q[4 * t]);
            acc = key_term<METRIC>(acc, held[i].y, q[4 * t + 1]);
            acc = key_term<METRIC>(acc, held[i].z, q[4 * t + 2]);
            acc = key_term<METRIC>(acc, held[i].w, q[4 * t + 3]);
        }
    }
    return acc;
}

// key_terms for rows of halves (IEEE bits), 8 a 16-byte unit, over units first, first + stride, ...: the walk
// of wide rows (algorithms/search_params.py WALK_HALF_MIN_DIM; rows and queries scaled alike). VPL > 0: at most VPL units
// a lane, every load issued before the first is used; 0: a loop
template <int METRIC, int VPL>
__device__ __forceinline__ float key_terms_half(const unsigned short* __restrict__ v, int dim, const float* q,
                                                int first, int stride) {
    const uint4* v4 = reinterpret_cast<const uint4*>(v);
    const int units = dim >> 3;
    float acc = 0.f;
    if (VPL > 0) {
        uint4 held[VPL > 0 ? VPL : 1];
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            const int t = first + i * stride;
            held[i] = t < units ? __ldg(v4 + t) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            const int t = first + i * stride;
            if (t < units) {
                const u32 w[4] = {held[i].x, held[i].y, held[i].z, held[i].w};
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    acc = key_term<METRIC>(acc, to_f((unsigned short)(w[h] & 0xffffu)), q[8 * t + 2 * h]);
                    acc = key_term<METRIC>(acc, to_f((unsigned short)(w[h] >> 16)), q[8 * t + 2 * h + 1]);
                }
            }
        }
    } else {
        for (int t = first; t < units; t += stride) {
            const uint4 u = __ldg(v4 + t);
            const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                acc = key_term<METRIC>(acc, to_f((unsigned short)(w[h] & 0xffffu)), q[8 * t + 2 * h]);
                acc = key_term<METRIC>(acc, to_f((unsigned short)(w[h] >> 16)), q[8 * t + 2 * h + 1]);
            }
        }
    }
    return acc;
}

// keys of rows ids[0..count) to q into keys[], TEAM lanes a row (4 rows a warp-wide step): a team's loads of
// a row are 128 contiguous bytes, and a hop costs steps by the rows it computes, not a whole row a lane
// (``first``, ``step``: the warp's first row and the rows all warps sharing the list take a step). VPL > 0:
// float4 rows of at most VPL units a lane (search.py units_per_lane), held in registers; 0: any rows
#define TEAM 8
template <int METRIC, int VPL, bool HALF = false>
__device__ __forceinline__ void team_keys(const float* __restrict__ x, int dim, const float* q,
                                          const int* ids, float* keys, int count, int lane, int first = 0,
                                          int step = 32 / TEAM, const unsigned short* __restrict__ xh = nullptr) {
    const int tl = lane & (TEAM - 1);
    for (int r0 = first; r0 < count; r0 += step) {
        const int r = r0 + lane / TEAM;
        float acc = 0.f;
        if (r < count) {
            if (HALF) {
                acc = key_terms_half<METRIC, VPL>(xh + (long long)ids[r] * dim, dim, q, tl, TEAM);
            } else {
                const float* v = x + (long long)ids[r] * dim;
                acc = VPL > 0 ? key_terms_held<METRIC, (VPL > 0 ? VPL : 1)>(v, dim, q, tl, TEAM)
                              : key_terms<METRIC>(v, dim, q, tl, TEAM);
            }
        }
        for (int off = TEAM / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, off);
        if (tl == 0 && r < count) keys[r] = METRIC == 0 ? acc : -acc;
    }
}

// a batch of queries checked and prepared where they are searched (graph_search.py searched_queries): a warp a
// row writes the row's largest magnitude (NaN where it holds NaN or Inf: the host's check names the row) and,
// where `unit`, scales the row to unit length (a zero row stays zero), as metric.py's prepare does on the host
extern "C" __global__ void __launch_bounds__(128) query_rows(float* __restrict__ q, int nq, int dim, int unit,
                                                             float* __restrict__ peak) {
    const int lane = threadIdx.x & 31;
    const int qi = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (qi >= nq) return;
    float* row = q + (long long)qi * dim;
    float top = 0.f, sq = 0.f;
    bool finite = true;
    for (int c = lane; c < dim; c += 32) {
        const float v = row[c];
        finite = finite && isfinite(v);
        top = fmaxf(top, fabsf(v));
        sq = fmaf(v, v, sq);
    }
    for (int stride = 16; stride > 0; stride >>= 1) {
        top = fmaxf(top, __shfl_xor_sync(FULL_MASK, top, stride));
        sq += __shfl_xor_sync(FULL_MASK, sq, stride);
    }
    finite = __all_sync(FULL_MASK, finite);
    if (lane == 0) peak[qi] = finite ? top : __int_as_float(0x7fc00000);
    if (!unit || !finite || sq <= 0.f) return;
    const float norm = sqrtf(sq);
    for (int c = lane; c < dim; c += 32) row[c] /= norm;
}

// ---- entry points: the SEEDS sample rows nearest each query (algorithms/search_index.py nearest_entries) --------------
// the (key, column) words of the reference, ascending across the warp's lanes (a bitonic network of shuffles)
__device__ __forceinline__ u64 warp_sorted(u64 v, int lane) {
    for (int size = 2; size <= 32; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const u64 o = __shfl_xor_sync(FULL_MASK, v, stride);
            v = ((lane & stride) == 0) == ((lane & size) == 0) ? min(v, o) : max(v, o);
        }
    return v;
}

// sample column c's word for a query: its key, -dot (ip) or |s_c|^2 - 2 dot (l2; the query's own norm dropped),
// as sortable bits over c, the reference's word (distinct: no tie is left to the selection)
template <int METRIC>
__device__ __forceinline__ u64 entry_word(const float* __restrict__ row, const float* __restrict__ norms, int c) {
    const float key = METRIC == 0 ? norms[c] - 2.f * row[c] : -row[c];
    return ((u64)f2s(key) << 32) | (u64)(u32)c;
}

// the 32 smallest of ``best`` (ascending across the lanes, one word a lane) and the n words at ``words``: each
// 32 of them that holds one smaller than best's last is sorted and merged in (the smallest of best and the 32
// reversed form a bitonic sequence; 5 steps sort it)
__device__ __forceinline__ u64 merged_in(u64 best, const u64* words, int n, int lane) {
    for (int g = 0; g < n; g += 32) {
        u64 word = g + lane < n ? words[g + lane] : ~0ull;
        if (!__any_sync(FULL_MASK, word < __shfl_sync(FULL_MASK, best, 31))) continue;
        word = warp_sorted(word, lane);
        best = min(best, __shfl_sync(FULL_MASK, word, 31 - lane));
        for (int stride = 16; stride > 0; stride >>= 1) {
            const u64 o = __shfl_xor_sync(FULL_MASK, best, stride);
            best = (lane & stride) == 0 ? min(best, o) : max(best, o);
        }
    }
    return best;
}

// one warp a query over its row of the (queries x sample) dot products. A first pass bounds the 32 smallest
// words: each lane's smallest are 32 distinct words, so the largest of them is at or above the 32nd smallest.
// The second pass packs the words at or under the bound into the warp's shared buffer (a few times 32 of the
// 4,096 where the keys are in no order), merging them into the 32 best kept (and tightening the bound) only when
// it fills, and at the end: a few sorts a query instead of one for most 32 columns. Out: the sample ids of the
// w = min(32, s) nearest, nearest first.
#define ENTRY_BUFFER 256  // words a warp packs before it merges them (2 KiB of shared memory a warp)
template <int METRIC>
__global__ void __launch_bounds__(128) entry_nearest(const float* __restrict__ dots, const float* __restrict__ norms,
        int s, int nq, const int* __restrict__ sample_ids, int w, int* __restrict__ out) {
    __shared__ u64 packed[128 / 32][ENTRY_BUFFER];  // a buffer a warp of the block (launch bounds: 128 threads)
    const int lane = threadIdx.x & 31;
    const int qi = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (qi >= nq) return;
    const float* row = dots + (long long)qi * s;
    u64 bound = ~0ull;  // a lane with no column (s < 32) leaves every word under the bound
#pragma unroll 4
    for (int c = lane; c < s; c += 32) bound = min(bound, entry_word<METRIC>(row, norms, c));
    for (int stride = 16; stride > 0; stride >>= 1) bound = max(bound, __shfl_xor_sync(FULL_MASK, bound, stride));
    u64* buffer = packed[threadIdx.x >> 5];
    u64 best = ~0ull;
    int held = 0;
    for (int c0 = 0; c0 < s; c0 += 32) {
        const int c = c0 + lane;
        const u64 word = c < s ? entry_word<METRIC>(row, norms, c) : ~0ull;
        const bool keep = c < s && word <= bound;
        const unsigned kept = __ballot_sync(FULL_MASK, keep);
        if (kept == 0u) continue;
        if (held + __popc(kept) > ENTRY_BUFFER) {
            __syncwarp();
            best = merged_in(best, buffer, held, lane);
            held = 0;
            bound = min(bound, __shfl_sync(FULL_MASK, best, 31));
            __syncwarp();
        }
        if (keep) buffer[held + __popc(kept & ((1u << lane) - 1u))] = word;
        held += __popc(kept);
    }
    __syncwarp();
    best = merged_in(best, buffer, held, lane);
    if (lane < w) out[(long long)qi * w + lane] = sample_ids[(u32)best];
}

