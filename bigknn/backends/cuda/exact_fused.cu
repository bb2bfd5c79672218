// Exact k-NN, continued (after exact.cu in compile.py's SOURCES): the fused tensor-core k-NN and the sort of
// each query's running list.

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
