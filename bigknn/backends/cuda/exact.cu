// Exact k-NN: top-k selection over cuBLAS dot-product tiles and exact keys. Follows common.cuh in the
// source compile.py builds.

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

// ---------------------------------------------------------------------------------------------
// Fused exact k-NN on tensor cores: queries against a chunk of rows, both as halves (u32 words = two
// halves, rows zero-padded to NK * 16 dims), dot products by mma.sync m16n8k16 (fp16 in, fp32 accumulate)
// and a running top-K per query kept in global memory (tk / ti, unsorted on entry is fine) -- no distance
// matrix ever reaches memory. Each warp owns 16 queries (their A fragments live in registers for the whole
// launch); the block streams the chunk through shared memory in tiles of FB_TILE rows (cp.async, a
// pipeline of FB_STAGES tiles, one barrier a tile), and each warp walks a tile in steps of FB_BN rows: a key
// below the query's current K-th key (tau) goes into the query's buffer; a buffer that could overflow in
// the next step (more than FB_CAP - FB_BN entries) is merged into the list (bitonic sort of list + buffer
// in the warp's scratch), which lowers tau. The caller centres the rows on a point c (exact.py): l2 keys
// |q-c|^2 + |b-c|^2 - 2 (q-c).(b-c) (qnorm: the queries' centred norms; bnorm: the rows', times
// 1 / (2 inv_scale), so that the pass test is one compare in product units), ip keys -(q.(b-c) + q.c)
// (qnorm: q.c); keys in true units (the products are of scaled halves: times inv_scale). The caller
// recomputes the kept keys exactly (knn_exact_keys).
// ---------------------------------------------------------------------------------------------
#define FB_WARPS 8   // warps per block: 128 queries
#define FB_TILE 128  // rows per shared tile (one barrier each)
#define FB_BN 32     // rows per warp step (4 mma column tiles)
#define FB_CAP 64    // buffered candidates per query
#define FB_SORT 256  // sort scratch per warp: list (K <= 128) + buffer (<= FB_CAP), a power of two
#ifndef FUSED_MODE
#define FUSED_MODE 0  // diagnostics only (scripts/bench_exact.py): 1 = tensor-core tiles without the filter
#endif

template <int NK> struct FusedShape {
    static constexpr int W = NK * 8;                  // words per row
    static constexpr int RSW = W + 4;                 // shared row stride: an mma fragment's 8 rows x 4 words hit 32 banks
    static constexpr int STAGES = NK <= 11 ? 3 : 2;   // tiles in flight (227 KB of shared memory bound it for wide rows)
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// four 8x8 half matrices from shared memory, each lane giving one row's address (lanes 8i..8i+7: matrix i):
// with rows of B and k halves 0-7 / 8-15 of two column tiles, the mma B fragments of both
__device__ __forceinline__ void ldmatrix_x4(u32* r, const u32* smem_row) {
    const u32 s = (u32)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

template <int METRIC, int NK>
__device__ __forceinline__ void fused_load_tile(u32* dst, float* dst_norm, const u32* __restrict__ B,
                                                const float* __restrict__ bnorm, int rows, int r0) {
    using S = FusedShape<NK>;
    constexpr int UPR = S::W / 4;  // 16-byte units per row
    for (int u = threadIdx.x; u < FB_TILE * UPR; u += FB_WARPS * 32) {
        const int r = u / UPR, cu = u - r * UPR;
        u32* d = dst + r * S::RSW + cu * 4;
        if (r0 + r < rows) cp_async16(d, B + (size_t)(r0 + r) * S::W + cu * 4);
        else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    // the rows' part of the pass threshold: l2 their scaled norms, ip nothing; +inf past the chunk's end
    for (int r = threadIdx.x; r < FB_TILE; r += FB_WARPS * 32)
        dst_norm[r] = r0 + r >= rows ? INF_F : (METRIC == 0 ? bnorm[r0 + r] : 0.f);
}

template <int METRIC, int NK>
__global__ void __launch_bounds__(FB_WARPS * 32, 1)
knn_fused(const u32* __restrict__ Q, int nq, const u32* __restrict__ B, int rows, const float* __restrict__ qnorm,
          const float* __restrict__ bnorm, float inv_scale, long long col_base, int K,
          float* __restrict__ tk, int* __restrict__ ti) {
    using S = FusedShape<NK>;
    constexpr int W = S::W, RSW = S::RSW, STAGES = S::STAGES;
    constexpr int QB = FB_WARPS * 16;
    extern __shared__ __align__(16) unsigned char fused_smem[];
    u32* sB = reinterpret_cast<u32*>(fused_smem);                      // [STAGES][FB_TILE][RSW]
    float* sBn = reinterpret_cast<float*>(sB + STAGES * FB_TILE * RSW); // [STAGES][FB_TILE]
    float* bufk = sBn + STAGES * FB_TILE;                              // [QB][FB_CAP]
    int* bufi = reinterpret_cast<int*>(bufk + QB * FB_CAP);            // [QB][FB_CAP]
    float* tau = reinterpret_cast<float*>(bufi + QB * FB_CAP);         // [QB]
    int* cnt = reinterpret_cast<int*>(tau + QB);                       // [QB]
    float* sk = reinterpret_cast<float*>(cnt + QB);                    // [FB_WARPS][FB_SORT]
    int* si = reinterpret_cast<int*>(sk + FB_WARPS * FB_SORT);         // [FB_WARPS][FB_SORT]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int wq = warp * 16;  // the warp's first query in the block
    const long long q0 = (long long)blockIdx.x * QB + wq;
    float* wsk = sk + warp * FB_SORT;
    int* wsi = si + warp * FB_SORT;

    // the warp's 16 queries: A fragments for every 16-dim step, qnorm, and tau from the lists (-inf for
    // queries past nq: nothing passes)
    u32 a[NK][4];
    const long long ra = q0 + g, rb = q0 + g + 8;
#pragma unroll
    for (int s = 0; s < NK; ++s) {
        const int w0 = s * 8 + tq;
        a[s][0] = ra < nq ? Q[ra * W + w0] : 0u;
        a[s][1] = rb < nq ? Q[rb * W + w0] : 0u;
        a[s][2] = ra < nq ? Q[ra * W + w0 + 4] : 0u;
        a[s][3] = rb < nq ? Q[rb * W + w0 + 4] : 0u;
    }
    const float qna = ra < nq ? qnorm[ra] : 0.f;  // l2: |q-c|^2; ip: q.c
    const float qnb = rb < nq ? qnorm[rb] : 0.f;
    const float rinv = 1.f / inv_scale, half_scale = 0.5f * rinv;  // key units -> product units
    if (lane < 16) {
        const long long q = q0 + lane;
        float mx = -INF_F;
        if (q < nq)
            for (int j = 0; j < K; ++j) mx = fmaxf(mx, tk[q * K + j]);
        tau[wq + lane] = mx;
        cnt[wq + lane] = 0;
    }

    // merge query r's buffer into its list (the whole warp; lanes agree on r)
    auto flush = [&](int r) {
        const long long q = q0 + r;
        const int c = cnt[wq + r];
        const int N = next_pow2(K + c);
        for (int j = lane; j < N; j += 32) {
            float key = INF_F;
            int id = -1;
            if (j < K) { key = tk[q * K + j]; id = ti[q * K + j]; }
            else if (j < K + c) { key = bufk[(wq + r) * FB_CAP + j - K]; id = bufi[(wq + r) * FB_CAP + j - K]; }
            wsk[j] = key;
            wsi[j] = id;
        }
        __syncwarp();
        warp_bitonic(wsk, wsi, N, lane);
        for (int j = lane; j < K; j += 32) {
            tk[q * K + j] = wsk[j];
            ti[q * K + j] = wsi[j];
        }
        if (lane == 0) {
            tau[wq + r] = wsk[K - 1];
            cnt[wq + r] = 0;
        }
        __syncwarp();
    };
    // flush every query of the warp whose buffer holds more than `over` entries
    auto flush_over = [&](int over) {
        u32 todo = __ballot_sync(FULL_MASK, lane < 16 && cnt[wq + lane] > over);
        while (todo) {
            const int r = __ffs(todo) - 1;
            todo &= todo - 1;
            flush(r);
        }
    };

    const int ntiles = (rows + FB_TILE - 1) / FB_TILE;
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < ntiles) fused_load_tile<METRIC, NK>(sB + st * FB_TILE * RSW, sBn + st * FB_TILE, B, bnorm, rows, st * FB_TILE);
        cp_async_commit();
    }
    for (int t = 0; t < ntiles; ++t) {
        const int ahead = t + STAGES - 1;  // its stage was read in iteration t - 1, which ended in a barrier
        if (ahead < ntiles) {
            const int st = ahead % STAGES;
            fused_load_tile<METRIC, NK>(sB + st * FB_TILE * RSW, sBn + st * FB_TILE, B, bnorm, rows, ahead * FB_TILE);
        }
        cp_async_commit();
        cp_async_wait<STAGES - 1>();  // tile t has landed
        __syncthreads();
        const u32* tb = sB + (t % STAGES) * FB_TILE * RSW;
        const float* tn = sBn + (t % STAGES) * FB_TILE;
        const int left = rows - t * FB_TILE;
        for (int s0 = 0; s0 < FB_TILE && s0 < left; s0 += FB_BN) {
            float c[FB_BN / 8][4];
#pragma unroll
            for (int j = 0; j < FB_BN / 8; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
#pragma unroll
            for (int s = 0; s < NK; ++s) {
#pragma unroll
                for (int j = 0; j < FB_BN / 8; j += 2) {  // one ldmatrix: both k halves of column tiles j, j + 1
                    const int mi = lane >> 3;
                    u32 b[4];
                    ldmatrix_x4(b, tb + (s0 + (j + (mi >> 1)) * 8 + (lane & 7)) * RSW + s * 8 + (mi & 1) * 4);
                    mma_16816(c[j], a[s], b);
                    mma_16816(c[j + 1], a[s], b + 2);
                }
            }
            // pass test in product units: c > thr(row) + tn(col) (thr from the row's tau, +inf past nq)
            const float ta = tau[wq + g], tbb = tau[wq + g + 8];
            const float tha = METRIC == 0 ? (qna - ta) * half_scale : (-ta - qna) * rinv;
            const float thb = METRIC == 0 ? (qnb - tbb) * half_scale : (-tbb - qnb) * rinv;
            float2 tcol[FB_BN / 8];
#pragma unroll
            for (int j = 0; j < FB_BN / 8; ++j) tcol[j] = *reinterpret_cast<const float2*>(&tn[s0 + j * 8 + 2 * tq]);
            auto thr = [&](int j, int h) { return (h >> 1 ? thb : tha) + (h & 1 ? tcol[j].y : tcol[j].x); };
            bool any = false;  // two instructions an element: the common case once the lists have filled
#pragma unroll
            for (int j = 0; j < FB_BN / 8; ++j)
#pragma unroll
                for (int h = 0; h < 4; ++h)
                    any |= FUSED_MODE == 1 ? c[j][h] == thr(j, h) * 1e30f  // keeps the products alive
                                           : c[j][h] > thr(j, h);
            if (__any_sync(FULL_MASK, any)) {
#pragma unroll
                for (int j = 0; j < FB_BN / 8; ++j)
#pragma unroll
                    for (int h = 0; h < 4; ++h) {
                        if (!(c[j][h] > thr(j, h))) continue;
                        const int col = s0 + j * 8 + 2 * tq + (h & 1);
                        const int r = g + (h >> 1) * 8;
                        const float qv = h >> 1 ? qnb : qna;
                        const float tc = h & 1 ? tcol[j].y : tcol[j].x;
                        const float key = METRIC == 0 ? fmaxf(fmaf(tc - c[j][h], 2.f * inv_scale, qv), 0.f)
                                                      : -fmaf(c[j][h], inv_scale, qv);
                        const int pos = atomicAdd(&cnt[wq + r], 1);
                        bufk[(wq + r) * FB_CAP + pos] = key;
                        bufi[(wq + r) * FB_CAP + pos] = (int)(col_base + (long long)t * FB_TILE + col);
                    }
            }
            __syncwarp();
            flush_over(FB_CAP - FB_BN);
        }
        __syncthreads();  // every warp is done with this tile's stage before it is loaded again
    }
    flush_over(0);
}

// ---------------------------------------------------------------------------------------------
// Each query's running list (kw <= 128 entries, any order) sorted by (key, id) and cut to k, a warp a row;
// +inf keys get the empty id. self_base >= 0 (a set's exact graph among itself): the row's own id
// (self_base + row) is skipped, as graph.py's drop_self does (where duplicates crowded it out of the first
// k + 1 entries, the k + 1-th goes instead: the first k others are kept either way).
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(128) knn_sort_rows(const float* __restrict__ tk, const int* __restrict__ ti, int nq,
                                                     int kw, int k, long long self_base, float* __restrict__ ok,
                                                     int* __restrict__ oi) {
    __shared__ float sk[4][128];
    __shared__ int si[4][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * 4 + warp;
    if (row >= nq) return;  // warp-uniform
    const int N = next_pow2(kw);
    for (int j = lane; j < N; j += 32) {
        sk[warp][j] = j < kw ? tk[row * kw + j] : INF_F;
        si[warp][j] = j < kw ? ti[row * kw + j] : -1;
    }
    __syncwarp();
    warp_bitonic(sk[warp], si[warp], N, lane);
    int self_pos = kw;  // none
    if (self_base >= 0)
        for (int j0 = 0; j0 < kw; j0 += 32) {
            const u32 hit = __ballot_sync(FULL_MASK, j0 + lane < kw && (long long)si[warp][j0 + lane] == self_base + row);
            if (hit) { self_pos = j0 + __ffs(hit) - 1; break; }
        }
    for (int j = lane; j < k; j += 32) {
        const int src = j + (j >= self_pos ? 1 : 0);
        const float key = src < N ? sk[warp][src] : INF_F;
        ok[row * k + j] = key;
        oi[row * k + j] = key < INF_F ? si[warp][src] : -1;
    }
}
