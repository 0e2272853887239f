// Binary, comparison, where, affine and fill kernels, one of each per dtype (see elementwise.cuh).
// SplitMix64's finaliser (kiln's random.rs `splitmix`: the masks are bit-equal on every device).
__device__ __forceinline__ u64 splitmix(u64 x) {
    u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define BINARY_FOR(T, NAME)                                                                               \
    extern "C" __global__ void binary_##NAME(u64 n, const T* a, const T* b, T* y, int op, int mode,      \
                                             Strided<3> l) {                                              \
        BinaryF<T> f = {op};                                                                              \
        map2<T, T>(n, a, b, y, mode, l, f);                                                               \
    }                                                                                                     \
    /* Contiguous operands only: no strided parameter block, so the launch copies less. */     \
    extern "C" __global__ void binary_c_##NAME(u64 n, const T* a, const T* b, T* y, int op, int mode) { \
        BinaryF<T> f = {op};                                                                              \
        Strided<3> none;                                                                                  \
        map2<T, T>(n, a, b, y, mode, none, f);                                                            \
    }                                                                                                     \
    extern "C" __global__ void cmp_##NAME(u64 n, const T* a, const T* b, u8* y, int op, int mode,        \
                                          Strided<3> l) {                                                 \
        CmpF<T> f = {op};                                                                                 \
        map2<T, u8>(n, a, b, y, mode, l, f);                                                              \
    }                                                                                                     \
    extern "C" __global__ void where_##NAME(u64 n, const u8* c, const T* a, const T* b, T* y, int mode,  \
                                            Strided<4> l) {                                               \
        FOR_EACH_STRIDED(4, mode, n, l, { y[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]]; })               \
    }                                                                                                     \
    extern "C" __global__ void affine_##NAME(u64 n, const T* x, const T* s, const T* h, T* y, int mode,    \
                                             Strided<4> l) {                                              \
        FOR_EACH_STRIDED(4, mode, n, l,                                                                   \
                         { y[off[0]] = from_c<T>(to_c(x[off[1]]) * to_c(s[off[2]]) + to_c(h[off[3]])); }) \
    }                                                                                                     \
    extern "C" __global__ void fill_##NAME(u64 n, T* y, double v) {                                       \
        T t = Cast<T, double>::run(v);                                                                    \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) \
            y[i] = t;                                                                                     \
    }                                                                                                     \
    /* Dropout mask of step *step (read here, so graph replays draw new masks): random.rs DropoutDraw. */ \
    extern "C" __global__ void dropout_mask_##NAME(u64 n, const i64* step, T* y, u64 seed, u32 threshold, \
                                                   double scale) {                                        \
        const u64 key = splitmix(seed + splitmix((u64)*step));                                            \
        const T keep = Cast<T, double>::run(scale), drop = Cast<T, double>::run(0.0);                     \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) \
            y[i] = (u32)(splitmix(key ^ i) >> 40) >= threshold ? keep : drop;                             \
    }
BINARY_FOR(f16, f16)
BINARY_FOR(bf16, bf16)
BINARY_FOR(float, f32)
BINARY_FOR(double, f64)
BINARY_FOR(u8, u8)
BINARY_FOR(u32, u32)
BINARY_FOR(i64, i64)
