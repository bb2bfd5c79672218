// Batch graph search, continued (after search_keys.cu in compile.py's SOURCES): where a search starts, the
// search list's updates, and the two procedures (TSDG Alg. 1 and 2).

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
