// GNND cross-matching (GNND paper §4): one block per list, distances between its samples, the nearest
// proposed into the candidate table (common.cuh). Follows common.cuh in the source compile.py builds.

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

template <typename T, int METRIC, int EXPAND, int MAXN, int TR, int TC, int DCMAX, int CROSS, int MMA>
__global__ void __launch_bounds__((MAXN / TR) * (2 * MAXN / TC), ((MAXN / TR) * (2 * MAXN / TC)) >= 512 ? 1 : 6)
gnnd_cross(const T* __restrict__ x, int n, int dpad, int k, int p, const int* __restrict__ new_s,
           const int* __restrict__ old_s, const int* __restrict__ cnt, const float* __restrict__ keys,
           const int* __restrict__ labels, int use_labels, u64* __restrict__ cand, int logC,
           const float* __restrict__ norms, int row0) {
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

    const int row = row0 + blockIdx.x, t = threadIdx.x;  // one block a list of rows row0...
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
