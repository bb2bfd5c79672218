// Batch graph search (TSDG §4), one warp per search: the kernels of bigknn/backends/cuda/search.py, step for
// step the NumPy reference bigknn/backends/cpu/graph_search.py (its docstring states the procedures and where
// they depart from the paper). Rows are float32 (n, dim); edges (n, deg) int32 global ids, EMPTY-padded;
// occlusion factors (n, deg) uint8. Keys as everywhere: squared L2, or -dot for ip.

#define SEARCH_SEG 16       // params.py QUEUE_SEGMENTS
#define SEARCH_SEG_LEN 32   // params.py SEGMENT


template <int METRIC>
__device__ __forceinline__ float key_term(float acc, float a, float b) {
    if (METRIC == 0) {
        float d = a - b;
        return acc + d * d;
    }
    return acc + a * b;
}

// key of row ``row`` of x to q, terms in dimension order; rows of a multiple of 4 dims are read as float4
// (x from CuPy is 256-byte aligned, so every such row is 16-byte aligned)
template <int METRIC>
__device__ __forceinline__ float row_key(const float* __restrict__ x, int dim, long long row, const float* q) {
    const float* v = x + row * (long long)dim;
    float acc = 0.f;
    if ((dim & 3) == 0) {
        const float4* v4 = reinterpret_cast<const float4*>(v);
        for (int t = 0; t < (dim >> 2); ++t) {
            float4 a = __ldg(v4 + t);
            acc = key_term<METRIC>(acc, a.x, q[4 * t]);
            acc = key_term<METRIC>(acc, a.y, q[4 * t + 1]);
            acc = key_term<METRIC>(acc, a.z, q[4 * t + 2]);
            acc = key_term<METRIC>(acc, a.w, q[4 * t + 3]);
        }
    } else {
        for (int t = 0; t < dim; ++t) acc = key_term<METRIC>(acc, __ldg(v + t), q[t]);
    }
    return METRIC == 0 ? acc : -acc;
}

// key -> the distance GGNN's slack is measured in (search/graph.py key_distance)
template <int METRIC>
__device__ __forceinline__ float key_dist(float key) { return METRIC == 0 ? sqrtf(fmaxf(key, 0.f)) : 1.f + key; }

// where search j of query qi starts (search/graph.py): its entry sample row j mod nstart, (row, key) on every
// lane; starts (nq, nstart) are the sample rows nearest each query, nearest first
template <int METRIC>
__device__ __forceinline__ void entry(const float* __restrict__ x, int dim, const float* q,
                                      const int* __restrict__ starts, int nstart, int qi, int j, int* row,
                                      float* key) {
    *row = starts[(long long)qi * nstart + j % nstart];
    *key = row_key<METRIC>(x, dim, *row, q);
}

// insert (id, key) into the ascending list held one entry a lane (lanes < width), after equal keys; the last
// entry falls off, and nothing happens where the new one is worse than all of a full list
__device__ __forceinline__ void lane_insert(float* lk, int* li, float key, int id, int width, int lane) {
    unsigned le = __ballot_sync(FULL_MASK, lane < width && *lk <= key);
    int pos = __popc(le);
    float pk = __shfl_up_sync(FULL_MASK, *lk, 1);
    int pi = __shfl_up_sync(FULL_MASK, *li, 1);
    if (pos < width && lane < width) {
        if (lane == pos) { *lk = key; *li = id; }
        else if (lane > pos) { *lk = pk; *li = pi; }
    }
}

// ---- Alg. 2: large batches, one warp a query --------------------------------------------------
// shared memory per warp: q[dim] | nb keys[deg] | nb ids[deg] | C keys[16*32] | C ids[16*32] | V ids[16*32]
template <int METRIC>
__global__ void __launch_bounds__(128) graph_search_large(
        const float* __restrict__ x, long long n, int dim, const int* __restrict__ edges,
        const unsigned char* __restrict__ lambdas, int deg, const float* __restrict__ queries,
        const int* __restrict__ starts, int nstart, int nq, int k, int lambda_visit, int hops, float tau,
        float nn1, int* __restrict__ out_ids, float* __restrict__ out_keys) {
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qi = blockIdx.x * (blockDim.x >> 5) + warp;
    if (qi >= nq) return;
    const int per_warp = dim + 2 * deg + 3 * SEARCH_SEG * SEARCH_SEG_LEN;
    float* q = smem + warp * per_warp;
    float* nbk = q + dim;
    int* nbi = (int*)(nbk + deg);
    float* ck = (float*)(nbi + deg);
    int* ci = (int*)(ck + SEARCH_SEG * SEARCH_SEG_LEN);
    int* vi = ci + SEARCH_SEG * SEARCH_SEG_LEN;
    for (int t = lane; t < dim; t += 32) q[t] = queries[(long long)qi * dim + t];
    for (int t = lane; t < SEARCH_SEG * SEARCH_SEG_LEN; t += 32) { ck[t] = INF_F; ci[t] = -1; vi[t] = -1; }
    __syncwarp();
    int u0; float k0;
    entry<METRIC>(x, dim, q, starts, nstart, qi, 0, &u0, &k0);
    float rk = lane == 0 ? k0 : INF_F;  // R: entry `lane` on lane `lane` (lanes < k)
    int ri = lane == 0 ? u0 : -1;
    int vhead = 0;  // lane s < 16: the ring head of V's segment s
    if (lane == 0) { ck[(u0 % SEARCH_SEG) * SEARCH_SEG_LEN] = k0; ci[(u0 % SEARCH_SEG) * SEARCH_SEG_LEN] = u0; }
    __syncwarp();
    for (int hop = 0; hop < hops; ++hop) {
        float head = lane < SEARCH_SEG ? ck[lane * SEARCH_SEG_LEN] : INF_F;
        int seg = lane;
        for (int off = 16; off > 0; off >>= 1) {  // the segment with the nearest head, the lowest on ties
            float oh = __shfl_xor_sync(FULL_MASK, head, off);
            int os = __shfl_xor_sync(FULL_MASK, seg, off);
            if (oh < head || (oh == head && os < seg)) { head = oh; seg = os; }
        }
        float r0 = __shfl_sync(FULL_MASK, rk, 0);
        float slack = tau * fmaxf(0.f, fminf(key_dist<METRIC>(r0), nn1));
        float last = __shfl_sync(FULL_MASK, rk, k - 1);
        if (isinf(head) || key_dist<METRIC>(head) > key_dist<METRIC>(last) + slack) break;
        float* sk = ck + seg * SEARCH_SEG_LEN;
        int* si = ci + seg * SEARCH_SEG_LEN;
        int u = si[0];
        float nk = lane + 1 < SEARCH_SEG_LEN ? sk[lane + 1] : INF_F;  // pop the front
        int ni = lane + 1 < SEARCH_SEG_LEN ? si[lane + 1] : -1;
        __syncwarp();
        sk[lane] = nk; si[lane] = ni;
        int vs = u % SEARCH_SEG;
        int h = __shfl_sync(FULL_MASK, vhead, vs);
        if (lane == 0) vi[vs * SEARCH_SEG_LEN + h] = u;
        if (lane == vs) vhead = (vhead + 1) % SEARCH_SEG_LEN;
        __syncwarp();
        // this hop's neighbours: those already visited, queued or in R are skipped; keys of the rest
        for (int c = lane; c < deg; c += 32) {
            int v = edges[(long long)u * deg + c];
            bool ok = v >= 0 && lambdas[(long long)u * deg + c] < lambda_visit;
            if (ok) {
                const int* vseg = vi + (v % SEARCH_SEG) * SEARCH_SEG_LEN;
                const int* cseg = ci + (v % SEARCH_SEG) * SEARCH_SEG_LEN;
                for (int t = 0; t < SEARCH_SEG_LEN && ok; ++t) ok = vseg[t] != v && cseg[t] != v;
            }
            nbi[c] = ok ? v : -1;
        }
        for (int t = 0; t < k; ++t) {  // in R?
            int rt = __shfl_sync(FULL_MASK, ri, t);
            for (int c = lane; c < deg; c += 32)
                if (nbi[c] == rt && rt >= 0) nbi[c] = -1;
        }
        for (int c = lane; c < deg; c += 32) nbk[c] = nbi[c] >= 0 ? row_key<METRIC>(x, dim, nbi[c], q) : INF_F;
        __syncwarp();
        for (int c = 0; c < deg; ++c) {  // inserted one by one in list order
            int v = nbi[c];
            if (v < 0) continue;
            float key = nbk[c];
            float lastr = __shfl_sync(FULL_MASK, rk, k - 1);
            if (key_dist<METRIC>(key) <= key_dist<METRIC>(lastr) + slack) {
                float* qk = ck + (v % SEARCH_SEG) * SEARCH_SEG_LEN;
                int* qd = ci + (v % SEARCH_SEG) * SEARCH_SEG_LEN;
                float lk = qk[lane];
                int li = qd[lane];
                lane_insert(&lk, &li, key, v, SEARCH_SEG_LEN, lane);
                __syncwarp();
                qk[lane] = lk; qd[lane] = li;
                __syncwarp();
            }
            if (key < lastr) lane_insert(&rk, &ri, key, v, k, lane);
        }
    }
    if (lane < k) {
        out_ids[(long long)qi * k + lane] = isinf(rk) ? -1 : ri;
        out_keys[(long long)qi * k + lane] = rk;
    }
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
