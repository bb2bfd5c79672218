// bigknn CUDA kernels, shared part: conventions, element conversion, ordering helpers, the candidate table.
//
// Compiled at run time by cupy.RawModule (NVRTC). The kernel files (compile.py SOURCES)
// include nothing: compile.py concatenates this header and them into one source, so that it builds with
// NVRTC alone and CuPy's cache key covers every line. Templates are instantiated through name_expressions.
//
// Conventions shared with bigknn/core/knn_graph.py:
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
// a descent whose lists span GPUs (spanning.py) compiles with GNND_SYSTEM_ATOMICS: the reverse samples' counts, the
// candidate table and the update count are then updated by both GPUs, atomically across them
#ifdef GNND_SYSTEM_ATOMICS
#define GNND_ATOMIC_ADD atomicAdd_system
#define GNND_ATOMIC_MIN atomicMin_system
#else
#define GNND_ATOMIC_ADD atomicAdd
#define GNND_ATOMIC_MIN atomicMin
#endif

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

// candidate table: per target row C = 2^logC slots; slot chosen by a hash of the neighbour id and
// the best (key, id) kept with a 64-bit atomicMin (lock-free; the same id always lands in the same slot)
#define MAX_SLOTS 128  // largest candidate table per row (logC <= 7); gnnd_merge stages one in shared memory
__device__ __forceinline__ void emit_candidate(int u, int v, float key, const float* __restrict__ keys, int k,
                                               u64* __restrict__ cand, int logC) {
    if (GNND_MODE != 0) return;
    if (!(key < keys[(size_t)u * k + (k - 1)])) return;
    const u32 slot = ((u32)v * 2654435761u) >> (32 - logC);
    const u64 packed = ((u64)f2s(key) << 32) | (u64)(u32)v;
    GNND_ATOMIC_MIN(&cand[((size_t)u << logC) + slot], packed);
}

// one tensor-core step: D (16 x 8, fp32) += A (16 x 16 halves, row-major) * B (16 x 8 halves, col-major); the
// fragments of mma.sync m16n8k16 (cross.cu's MMA tiles, exact_fused.cu's k-NN)
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
