// Shared by every kiln kernel source. Needs no CUDA toolkit header: 16-bit floats are
// stored as raw bits and converted with PTX `cvt` instructions; math comes from NVRTC's
// built-in device functions.

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

struct __align__(2) f16 { unsigned short bits; };
struct __align__(2) bf16 { unsigned short bits; };

#define MAX_DIMS 8

// 16 bytes of elements, for vector loads and stores.
template <typename T> struct __align__(16) Pack { T v[16 / sizeof(T)]; };

// ---- conversions to and from the compute type (f32, or f64 for f64) --------------------
__device__ __forceinline__ float to_c(f16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits)); return f; }
__device__ __forceinline__ float to_c(bf16 h) { return __uint_as_float(((u32)h.bits) << 16); }
__device__ __forceinline__ float to_c(float x) { return x; }
__device__ __forceinline__ double to_c(double x) { return x; }
__device__ __forceinline__ u8 to_c(u8 x) { return x; }
__device__ __forceinline__ u32 to_c(u32 x) { return x; }
__device__ __forceinline__ i64 to_c(i64 x) { return x; }

template <typename T> struct Compute { typedef T type; };
template <> struct Compute<f16> { typedef float type; };
template <> struct Compute<bf16> { typedef float type; };

template <typename T> __device__ __forceinline__ T from_c(typename Compute<T>::type v) { return v; }
template <> __device__ __forceinline__ f16 from_c<f16>(float v) { f16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v)); return h; }
template <> __device__ __forceinline__ bf16 from_c<bf16>(float v) { bf16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v)); return h; }

template <typename T> struct IsFloat { static const bool value = false; };
template <> struct IsFloat<f16> { static const bool value = true; };
template <> struct IsFloat<bf16> { static const bool value = true; };
template <> struct IsFloat<float> { static const bool value = true; };
template <> struct IsFloat<double> { static const bool value = true; };

// ---- casts with the CPU backend's semantics ------------------------------------------
// Float to integer truncates toward zero and saturates (NaN -> 0); integer to integer wraps.
template <typename T> __device__ __forceinline__ double to_f64(T x) { return (double)to_c(x); }
template <typename O> __device__ __forceinline__ O sat_from_f64(double v);
template <> __device__ __forceinline__ u8 sat_from_f64<u8>(double v) { return v != v ? 0 : v <= 0.0 ? 0 : v >= 255.0 ? 255 : (u8)v; }
template <> __device__ __forceinline__ u32 sat_from_f64<u32>(double v) { return v != v ? 0 : v <= 0.0 ? 0 : v >= 4294967295.0 ? 4294967295u : (u32)v; }
template <> __device__ __forceinline__ i64 sat_from_f64<i64>(double v) { return v != v ? 0 : v <= -9223372036854775808.0 ? (i64)0x8000000000000000ull : v >= 9223372036854775807.0 ? 0x7fffffffffffffffll : (i64)v; }

template <typename O, typename I> struct Cast {
    __device__ __forceinline__ static O run(I x) {
        if constexpr (IsFloat<O>::value) {
            return from_c<O>((typename Compute<O>::type)to_c(x));
        } else if constexpr (IsFloat<I>::value) {
            return sat_from_f64<O>(to_f64(x));
        } else {
            return (O)(i64)to_c(x);
        }
    }
};
// f16 <-> bf16 <-> f32 through f32 (exact widening, one rounding).
template <typename O> struct Cast<O, double> {
    __device__ __forceinline__ static O run(double x) {
        if constexpr (IsFloat<O>::value) return from_c<O>((typename Compute<O>::type)x);
        else return sat_from_f64<O>(x);
    }
};

// ---- strided indexing ------------------------------------------------------------------
// Up to MAX_DIMS merged dims; each operand has its own strides (0 for broadcast dims).
template <int K> struct Strided {
    u32 rank;
    u64 dims[MAX_DIMS];
    u64 strides[K][MAX_DIMS];
};

// Storage offsets of row-major element `i` for each operand. `I` is u32 when every index
// and offset fits, which makes the divisions cheap.
template <int K, typename I>
__device__ __forceinline__ void strided_offsets(I i, const Strided<K>& l, I (&off)[K]) {
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = 0;
    for (int d = (int)l.rank - 1; d >= 0; --d) {
        I dim = (I)l.dims[d];
        I idx = i % dim;
        i /= dim;
#pragma unroll
        for (int k = 0; k < K; ++k) off[k] += idx * (I)l.strides[k][d];
    }
}

// ---- block reductions ------------------------------------------------------------------
__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ double shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ i64 shfl_xor(i64 v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ u32 shfl_xor(u32 v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ u8 shfl_xor(u8 v, int m) { return (u8)__shfl_xor_sync(0xffffffffu, (u32)v, m); }

// Device-wide flag an index kernel raises on an out-of-range index; the host checks it at
// the next synchronisation and reports an error.
__device__ __forceinline__ void raise_flag(u32* flag, u32 code) { atomicCAS(flag, 0u, code); }
