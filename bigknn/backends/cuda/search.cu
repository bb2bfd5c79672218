// Batch graph search (TSDG §4), one warp per search: the kernels of bigknn/backends/cuda/graph_search.py, step for
// step the NumPy reference bigknn/backends/cpu/graph_search.py (its docstring states the procedures and where
// they depart from the paper). Rows are float32 (n, dim); edges (n, deg) int32 global ids, EMPTY-padded;
// occlusion factors (n, deg) uint8. Keys as everywhere: squared L2, or -dot for ip.



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

// where search j of query qi starts (algorithms/search_index.py): its entry sample row j mod nstart, (row, key) on every
// lane; starts (nq, nstart) are the sample rows nearest each query, nearest first
template <int METRIC>
__device__ __forceinline__ void entry(const float* __restrict__ x, int dim, const float* q,
                                      const int* __restrict__ starts, int nstart, int qi, int j, int* row,
                                      float* key) {
    *row = starts[(long long)qi * nstart + j % nstart];
    *key = row_key<METRIC>(x, dim, *row, q);
}

// mark row v computed in a warp's table of 2^bits slots (open addressing, -1 empty); true where it was not there
__device__ __forceinline__ bool first_visit(int* table, int bits, int v) {
    unsigned mask = (1u << bits) - 1u;
    unsigned h = ((unsigned)v * 2654435761u) >> (32 - bits);
    while (true) {
        int old = atomicCAS(table + h, -1, v);
        if (old == -1) return true;
        if (old == v) return false;
        h = (h + 1u) & mask;
    }
}

// R <- the best ``width`` of R (keys lk ascending, ids li, expanded flags lx) and the fresh rows, ``counts[p]``
// of them at ck / ci + p * stride for p < lists, unexpanded: R first among equal keys, then the fresh rows in
// their order. That is inserting them one by one (a row that does not beat R's last at its turn never would
// later), in warp-wide passes: the rows beating R's last are packed to the front of ck / ci (order kept) and
// merged 32 at a time. Each lane holds one row of a group, ranks it in the group by (key, order) and places it
// after R's entries of keys <= its own; each entry of R moves up by the group's keys below its own. Every lane
// calls it.
#define LIST_UNITS 8  // R's entries a lane holds while R moves: algorithms/search_params.py LIST_MAX / 32
__device__ __forceinline__ void list_merge(float* lk, int* li, unsigned char* lx, int width, float* ck, int* ci,
                                           const int* counts, int lists, int stride, int lane) {
    const float last = lk[width - 1];
    int packed = 0;
    for (int p = 0; p < lists; ++p) {
        for (int c0 = 0; c0 < counts[p]; c0 += 32) {  // writes land below every row not read yet
            const bool in = c0 + lane < counts[p];
            const float key = in ? ck[p * stride + c0 + lane] : INF_F;
            const int id = in ? ci[p * stride + c0 + lane] : -1;
            const unsigned got = __ballot_sync(FULL_MASK, key < last);
            if (key < last) {
                const int at = packed + __popc(got & ((1u << lane) - 1u));
                ck[at] = key;
                ci[at] = id;
            }
            packed += __popc(got);
            __syncwarp();
        }
    }
    for (int g = 0; g < packed; g += 32) {
        const int m = min(32, packed - g);
        const float key = lane < m ? ck[g + lane] : INF_F;
        const int id = lane < m ? ci[g + lane] : -1;
        if (!__any_sync(FULL_MASK, key < lk[width - 1])) continue;
        int rank = 0;  // in the group, by (key, order)
        for (int l = 0; l < m; ++l) {
            const float o = __shfl_sync(FULL_MASK, key, l);
            rank += o < key || (o == key && l < lane);
        }
        int lo = 0, hi = width;  // R's entries of keys <= key
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (lk[mid] <= key) lo = mid + 1; else hi = mid;
        }
        __syncwarp();
        if (lane < m) ck[g + rank] = key;  // the group's keys ascending, where it was read
        __syncwarp();
        float rk_[LIST_UNITS];  // R's entries this lane moves, and where to
        int ri_[LIST_UNITS], to[LIST_UNITS];
        unsigned char rx_[LIST_UNITS];
#pragma unroll
        for (int u = 0; u < LIST_UNITS; ++u) {
            const int j = lane + 32 * u;
            to[u] = width;
            if (j < width) {
                rk_[u] = lk[j];
                ri_[u] = li[j];
                rx_[u] = lx[j];
                int a = 0, b = m;  // the group's keys below R's entry j
                while (a < b) {
                    const int mid = (a + b) >> 1;
                    if (ck[g + mid] < rk_[u]) a = mid + 1; else b = mid;
                }
                to[u] = j + a;
            }
        }
        __syncwarp();
#pragma unroll
        for (int u = 0; u < LIST_UNITS; ++u)
            if (to[u] < width) { lk[to[u]] = rk_[u]; li[to[u]] = ri_[u]; lx[to[u]] = rx_[u]; }
        if (lane < m && rank + lo < width) { lk[rank + lo] = key; li[rank + lo] = id; lx[rank + lo] = 0; }
        __syncwarp();
    }
}

// ---- Alg. 2: large batches: a search list of ``width`` entries, ``parents`` of them expanded a hop ----------
// QW warps a query: 1 where the batch fills the GPU (several queries a block), else a block a query (its warps
// share the list and compute the keys of different rows; warp 0 keeps the list). The same results either way.
// Shared memory per query (search.py large_floats): q[dim] | R keys[wpad] | R ids[wpad] | R expanded[wpad]
// bytes | per parent: neighbour keys[nb] | per parent: neighbour ids[nb] | fresh counts[parents] |
// parents[parents] | rows computed[2] | the table of rows computed[2^bits]; wpad = width rounded up to 32,
// nb = max(deg, 32) (the seeds pass through parent 0's). The table is cleared (R's rows put back) when the
// next hop could fill it past half.
template <int QW>
__device__ __forceinline__ void query_sync() {
    if (QW == 1) __syncwarp(); else __syncthreads();
}

// HALF: the walk's keys from xh, the rows as halves scaled by ``scale`` (the query scaled alike), and R's first
// RERANK entries re-keyed from the float32 rows and sorted by (key, id) for the result (algorithms/search_params.py)
#define RERANK 32
template <int METRIC, int QW, int VPL, bool HALF>
__global__ void __launch_bounds__(256) graph_search_large(
        const float* __restrict__ x, long long n, int dim, const int* __restrict__ edges,
        const unsigned char* __restrict__ lambdas, int deg, const float* __restrict__ queries,
        const int* __restrict__ starts, int nstart, int nq, int k, int width, int parents, int lambda_visit,
        int hops, int bits, int* __restrict__ out_ids, float* __restrict__ out_keys, int* __restrict__ work,
        const unsigned short* __restrict__ xh, float scale) {
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wq = warp % QW, slot = warp / QW;  // this warp among its query's, the query's place in the block
    const int qi = blockIdx.x * (blockDim.x / (32 * QW)) + slot;
    if (qi >= nq) return;
    const int wpad = (width + 31) & ~31, slots = 1 << bits, nb = max(deg, 32);
    float* q = smem + slot * (dim + 2 * wpad + wpad / 4 + 2 * parents * nb + 2 * parents + 2 + slots);
    float* rk = q + dim;
    int* ri = (int*)(rk + wpad);
    unsigned char* rx = (unsigned char*)(ri + wpad);
    float* nbk = (float*)(rx + wpad);
    int* nbi = (int*)(nbk + parents * nb);
    int* fresh = nbi + parents * nb;
    int* par = fresh + parents;
    int* computed = par + parents;
    int* table = computed + 2;
    const int tid = wq * 32 + lane;
    for (int t = tid; t < dim; t += 32 * QW) q[t] = queries[(long long)qi * dim + t] * (HALF ? scale : 1.f);
    for (int t = tid; t < wpad; t += 32 * QW) { rk[t] = INF_F; ri[t] = -1; rx[t] = 0; }
    for (int t = tid; t < slots; t += 32 * QW) table[t] = -1;
    query_sync<QW>();
    if (wq == 0) {  // R <- the seeds
        const int seeds = min(nstart, 32);
        if (lane < seeds) {
            nbi[lane] = starts[(long long)qi * nstart + lane];
            first_visit(table, bits, nbi[lane]);
        }
        if (lane == 0) *computed = seeds;
        __syncwarp();
        team_keys<METRIC, VPL, HALF>(x, dim, q, nbi, nbk, seeds, lane, 0, 32 / TEAM, xh);
        if (lane == 0) fresh[0] = seeds;
        __syncwarp();
        list_merge(rk, ri, rx, width, nbk, nbi, fresh, 1, nb, lane);
    }
    query_sync<QW>();
    int rows_done = min(nstart, 32), hop = 0;  // the rows whose keys the search computed, the hops it made
    for (; hop < hops; ++hop) {
        if (wq == 0) {  // the parents: R's nearest entries not expanded yet
            int found = 0;
            for (int c = 0; c < width && found < parents; c += 32) {
                const int t = c + lane;
                unsigned open = __ballot_sync(FULL_MASK, t < width && !isinf(rk[t]) && !rx[t]);
                for (; open && found < parents; ++found) {
                    const int b = __ffs(open) - 1;
                    open &= open - 1;
                    if (lane == 0) { par[found] = ri[c + b]; rx[c + b] = 1; }
                }
            }
            if (lane == 0)
                for (int p = found; p < parents; ++p) par[p] = -1;
            __syncwarp();
            if (*computed + parents * deg > (slots >> 1)) {  // forget all but R's rows
                for (int t = lane; t < slots; t += 32) table[t] = -1;
                __syncwarp();
                int kept = 0;
                for (int c = 0; c < width; c += 32) {
                    int v = c + lane < width ? ri[c + lane] : -1;
                    kept += __popc(__ballot_sync(FULL_MASK, v >= 0 && first_visit(table, bits, v)));
                }
                if (lane == 0) *computed = kept;
            }
        }
        query_sync<QW>();
        if (par[0] < 0) break;
        for (int p = wq; p < parents; p += QW) {  // each parent's neighbours not computed before, in list order
            const int u = par[p];
            int count = 0;
            for (int c0 = 0; u >= 0 && c0 < deg; c0 += 32) {
                const int c = c0 + lane;
                const int v = c < deg ? edges[(long long)u * deg + c] : -1;
                bool ok = v >= 0 && lambdas[(long long)u * deg + c] < lambda_visit && first_visit(table, bits, v);
                unsigned got = __ballot_sync(FULL_MASK, ok);
                if (ok) nbi[p * nb + count + __popc(got & ((1u << lane) - 1u))] = v;
                count += __popc(got);
            }
            if (lane == 0) fresh[p] = count;
        }
        query_sync<QW>();
        for (int p = 0; p < parents; ++p)
            team_keys<METRIC, VPL, HALF>(x, dim, q, nbi + p * nb, nbk + p * nb, fresh[p], lane, wq * (32 / TEAM),
                                         QW * (32 / TEAM), xh);
        query_sync<QW>();
        if (wq == 0) {  // merged as if inserted one by one: parent by parent, each in list order
            int added = 0;
            for (int p = 0; p < parents; ++p) added += fresh[p];
            list_merge(rk, ri, rx, width, nbk, nbi, fresh, parents, nb, lane);
            if (lane == 0) { *computed += added; rows_done += added; }
            __syncwarp();
        }
        query_sync<QW>();
    }
    if (HALF && wq == 0) {  // R's first RERANK (a finite prefix) re-keyed in float32, sorted by (key, id)
        for (int t = lane; t < dim; t += 32) q[t] = queries[(long long)qi * dim + t];
        const int m = __popc(__ballot_sync(FULL_MASK, lane < min(RERANK, width) && !isinf(rk[lane])));
        nbi[lane] = lane < m ? ri[lane] : -1;
        nbk[lane] = INF_F;
        __syncwarp();
        team_keys<METRIC, (2 * VPL <= 16 ? 2 * VPL : 0)>(x, dim, q, nbi, nbk, m, lane);
        __syncwarp();
        warp_bitonic(nbk, nbi, RERANK, lane);
        if (lane < k) {
            out_ids[(long long)qi * k + lane] = isinf(nbk[lane]) ? -1 : nbi[lane];
            out_keys[(long long)qi * k + lane] = nbk[lane];
        }
    } else if (wq == 0 && lane < k) {
        out_ids[(long long)qi * k + lane] = isinf(rk[lane]) ? -1 : ri[lane];
        out_keys[(long long)qi * k + lane] = rk[lane];
    }
    if (wq == 0 && lane == 0) { work[2 * qi] = rows_done; work[2 * qi + 1] = hop; }
}

// ---- Alg. 1: small batches, one warp a search (search s: query s / t0, search number s % t0) ---------
// shared memory per warp: q[dim] | merge keys[64] | merge slots[64]; R_ij (32) is one entry a lane
template <int METRIC>
__global__ void __launch_bounds__(128) graph_search_small(
        const float* __restrict__ x, long long n, int dim, const int* __restrict__ edges,
        const unsigned char* __restrict__ lambdas, int deg, const float* __restrict__ queries,
        const int* __restrict__ starts, int nstart, int nsearch, int t0, int lambda_visit, int hops,
        int* __restrict__ out_ids, float* __restrict__ out_keys) {
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int s = blockIdx.x * (blockDim.x >> 5) + warp;
    if (s >= nsearch) return;
    const int qi = s / t0;
    float* q = smem + warp * (dim + 128);
    float* mk = q + dim;
    int* ms = (int*)(mk + 64);
    for (int t = lane; t < dim; t += 32) q[t] = queries[(long long)qi * dim + t];
    __syncwarp();
    int u; float uk;
    entry<METRIC>(x, dim, q, starts, nstart, qi, s % t0, &u, &uk);
    float bk = INF_F;  // R_ij, ascending
    int bi = -1;
    for (int hop = 0; hop < hops; ++hop) {
        float tk = INF_F;  // R_temp: slot `lane` holds the nearest of neighbours lane, lane + 32, ...
        int ti = -1;
        for (int c = lane; c < deg; c += 32) {
            int v = edges[(long long)u * deg + c];
            if (v < 0 || lambdas[(long long)u * deg + c] >= lambda_visit) continue;
            float key = row_key<METRIC>(x, dim, v, q);
            if (key < tk) { tk = key; ti = v; }
        }
        float best = tk;
        int at = lane;
        for (int off = 16; off > 0; off >>= 1) {  // R_temp's nearest, the lowest slot on ties
            float ob = __shfl_xor_sync(FULL_MASK, best, off);
            int oa = __shfl_xor_sync(FULL_MASK, at, off);
            if (ob < best || (ob == best && oa < at)) { best = ob; at = oa; }
        }
        int nxt = __shfl_sync(FULL_MASK, ti, at);
        bool seen = false;  // already in R_ij: not inserted again
        for (int t = 0; t < 32; ++t) seen |= (__shfl_sync(FULL_MASK, bi, t) == ti && ti >= 0);
        float fresh = seen ? INF_F : tk;
        float lastb = __shfl_sync(FULL_MASK, bk, 31);
        bool updated = __any_sync(FULL_MASK, fresh < lastb);
        // R_ij <- the best 32 of R_ij then R_temp (R_ij first among equal keys): a stable sort by (key, slot)
        mk[lane] = bk; ms[lane] = lane;
        mk[lane + 32] = fresh; ms[lane + 32] = lane + 32;
        __syncwarp();
        warp_bitonic(mk, ms, 64, lane);
        int from = ms[lane];
        float nk = mk[lane];
        int ni_b = __shfl_sync(FULL_MASK, bi, from & 31);
        int ni_t = __shfl_sync(FULL_MASK, ti, from & 31);
        __syncwarp();
        bk = nk;
        bi = isinf(nk) ? -1 : (from < 32 ? ni_b : ni_t);
        u = nxt;
        if (!updated) break;
    }
    out_ids[(long long)s * 32 + lane] = bi;
    out_keys[(long long)s * 32 + lane] = bk;
}
