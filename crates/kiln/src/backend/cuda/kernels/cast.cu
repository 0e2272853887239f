// Casts between every pair of dtypes, and strided copies (a cast to the same dtype).
#define CAST(I, IN, O, ON)                                                                                   \
    extern "C" __global__ void cast_##IN##_##ON(u64 n, const I* x, O* y, int mode, Strided<2> l) {           \
        CastF<O, I> f;                                                                                       \
        map1<I, O>(n, x, y, mode, l, f);                                                                     \
    }
#define CAST_FROM(I, IN)                                                                                     \
    CAST(I, IN, f16, f16) CAST(I, IN, bf16, bf16) CAST(I, IN, float, f32) CAST(I, IN, double, f64)           \
    CAST(I, IN, u8, u8) CAST(I, IN, u32, u32) CAST(I, IN, i64, i64)
CAST_FROM(f16, f16)
CAST_FROM(bf16, bf16)
CAST_FROM(float, f32)
CAST_FROM(double, f64)
CAST_FROM(u8, u8)
CAST_FROM(u32, u32)
CAST_FROM(i64, i64)
