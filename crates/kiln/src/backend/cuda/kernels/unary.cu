// Unary kernels: one per dtype, the op given by a code (see elementwise.cuh).
#define UNARY_FOR(T, NAME)                                                                                \
    extern "C" __global__ void unary_##NAME(u64 n, const T* x, T* y, int op, double p0, double p1, int mode, \
                                            Strided<2> l) {                                               \
        unary_kernel<T>(n, x, y, op, p0, p1, mode, l);                                                    \
    }
UNARY_FOR(f16, f16)
UNARY_FOR(bf16, bf16)
UNARY_FOR(float, f32)
UNARY_FOR(double, f64)
UNARY_FOR(u8, u8)
UNARY_FOR(u32, u32)
UNARY_FOR(i64, i64)
