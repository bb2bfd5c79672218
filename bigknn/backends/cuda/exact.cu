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

