// Shared by the element-wise kernel sources (unary.cu, binary.cu, cast.cu): op codes, the op
// functors and the drivers that walk layouts. Each kernel serves every layout through `mode`:
//   0: contiguous, 16-byte aligned -> 16-byte vector loads and stores, scalar tail
//   1: contiguous, unaligned       -> scalar
//   2: strided, 32-bit index math  3: strided, 64-bit index math
// Contiguous kernels take pointers already advanced to each operand's offset.

// Op codes: keep in sync with `UnaryCode` in cuda/elementwise.rs.
#define U_NEG 0
#define U_ABS 1
#define U_SQR 2
#define U_RELU 3
#define U_EXP 4
#define U_LOG 5
#define U_SQRT 6
#define U_RECIP 7
#define U_SIN 8
#define U_COS 9
#define U_TANH 10
#define U_SIGMOID 11
#define U_GELU_ERF 12
#define U_GELU_TANH 13
#define U_SILU 14
#define U_CLAMP 15
#define U_ADD_S 16
#define U_SUB_S 17
#define U_RSUB_S 18
#define U_MUL_S 19
#define U_DIV_S 20
#define U_RDIV_S 21
#define U_MAX_S 22
#define U_MIN_S 23
#define U_POW_S 24
#define U_RPOW_S 25
#define U_GELU_ERF_GRAD 26
#define U_GELU_TANH_GRAD 27
#define U_RELU_GRAD_S 28
#define U_RRELU_GRAD_S 29
#define U_ERF 30

#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_MAX 4
#define B_MIN 5
#define B_POW 6
#define B_RELU_GRAD 7
#define B_ADD_RELU 8
#define B_MUL_RELU 9
#define B_COUNT_FINITE 10

#define C_EQ 0
#define C_NE 1
#define C_LT 2
#define C_LE 3
#define C_GT 4
#define C_GE 5

__device__ __forceinline__ float k_exp(float x) { return expf(x); }
__device__ __forceinline__ double k_exp(double x) { return exp(x); }
__device__ __forceinline__ float k_log(float x) { return logf(x); }
__device__ __forceinline__ double k_log(double x) { return log(x); }
__device__ __forceinline__ float k_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double k_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float k_sin(float x) { return sinf(x); }
__device__ __forceinline__ double k_sin(double x) { return sin(x); }
__device__ __forceinline__ float k_cos(float x) { return cosf(x); }
__device__ __forceinline__ double k_cos(double x) { return cos(x); }
__device__ __forceinline__ float k_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double k_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float k_erf(float x) { return erff(x); }
__device__ __forceinline__ double k_erf(double x) { return erf(x); }
__device__ __forceinline__ float k_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double k_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float k_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double k_abs(double x) { return fabs(x); }

// NaN-propagating max/min, as on the CPU.
template <typename C> __device__ __forceinline__ C k_max(C a, C b) { return (a != a || a > b) ? a : b; }
template <typename C> __device__ __forceinline__ C k_min(C a, C b) { return (a != a || a < b) ? a : b; }

template <typename C> __device__ __forceinline__ C unary_float(int op, C x, C p0, C p1) {
    switch (op) {
        case U_NEG: return -x;
        case U_ABS: return k_abs(x);
        case U_SQR: return x * x;
        case U_RELU: return x <= (C)0 ? (C)0 : x;
        case U_EXP: return k_exp(x);
        case U_LOG: return k_log(x);
        case U_SQRT: return k_sqrt(x);
        case U_RECIP: return (C)1 / x;
        case U_SIN: return k_sin(x);
        case U_COS: return k_cos(x);
        case U_TANH: return k_tanh(x);
        case U_SIGMOID: return (C)1 / ((C)1 + k_exp(-x));
        case U_ERF: return k_erf(x);
        case U_GELU_ERF: return (C)0.5 * x * ((C)1 + k_erf(x * (C)0.70710678118654752440));
        case U_GELU_TANH: return (C)0.5 * x * ((C)1 + k_tanh((C)0.79788456080286535588 * (x + (C)0.044715 * x * x * x)));
        case U_SILU: return x / ((C)1 + k_exp(-x));
        case U_CLAMP: return k_max(k_min(x, p1), p0);
        case U_ADD_S: return x + p0;
        case U_SUB_S: return x - p0;
        case U_RSUB_S: return p0 - x;
        case U_MUL_S: return x * p0;
        case U_DIV_S: return x / p0;
        case U_RDIV_S: return p0 / x;
        case U_MAX_S: return k_max(x, p0);
        case U_MIN_S: return k_min(x, p0);
        case U_POW_S: return k_pow(x, p0);
        case U_RPOW_S: return k_pow(p0, x);
        case U_RELU_GRAD_S: return p0 > (C)0 ? x : (C)0;
        case U_RRELU_GRAD_S: return x > (C)0 ? p0 : (C)0;
        case U_GELU_ERF_GRAD: {
            C cdf = (C)0.5 * ((C)1 + k_erf(x * (C)0.70710678118654752440));
            // At ±inf, x·φ(x) is inf·0: the limits are the cdf's, 1 and 0 (as on the CPU).
            if (isinf(x)) return cdf;
            return cdf + x * k_exp((C)-0.5 * x * x) * (C)0.39894228040143267794;
        }
        case U_GELU_TANH_GRAD: {
            const C k = (C)0.79788456080286535588, c = (C)0.044715;
            // Beyond 1e19 the derivative is 1 or 0 in f32 and f64, and 3c·x² could overflow
            // into 0·inf (as on the CPU). NaN fails both tests and stays NaN.
            if (x > (C)1e19) return (C)1;
            if (x < (C)-1e19) return (C)0;
            C t = k_tanh(k * (x + c * x * x * x));
            return (C)0.5 * ((C)1 + t) + (C)0.5 * x * ((C)1 - t * t) * k * ((C)1 + (C)3 * c * x * x);
        }
        default: return x;
    }
}

// Integer division by zero gives 0, as on the CPU.
template <typename T> __device__ __forceinline__ T int_div(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }
__device__ __forceinline__ i64 int_div(i64 a, i64 b) {
    return b == 0 ? 0 : (a == (i64)0x8000000000000000ull && b == -1) ? a : a / b;
}
template <typename T> __device__ __forceinline__ T int_abs(T x) { return x; }
__device__ __forceinline__ i64 int_abs(i64 x) { return x < 0 ? (i64)(0ull - (u64)x) : x; }

template <typename T> __device__ __forceinline__ T unary_int(int op, T x, T p0, T p1) {
    switch (op) {
        case U_NEG: return (T)(0 - x);
        case U_ABS: return int_abs(x);
        case U_SQR: return (T)(x * x);
        case U_RELU: return x > (T)0 ? x : (T)0;
        case U_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
        case U_ADD_S: return (T)(x + p0);
        case U_SUB_S: return (T)(x - p0);
        case U_RSUB_S: return (T)(p0 - x);
        case U_MUL_S: return (T)(x * p0);
        case U_DIV_S: return int_div(x, p0);
        case U_RDIV_S: return int_div(p0, x);
        case U_MAX_S: return x > p0 ? x : p0;
        case U_MIN_S: return x < p0 ? x : p0;
        case U_RELU_GRAD_S: return p0 > (T)0 ? x : (T)0;
        case U_RRELU_GRAD_S: return x > (T)0 ? p0 : (T)0;
        default: return x;
    }
}

template <typename T, bool F> struct UnaryImpl;
template <typename T> struct UnaryImpl<T, true> {
    __device__ __forceinline__ static T run(int op, T x, double p0, double p1) {
        typedef typename Compute<T>::type C;
        return from_c<T>(unary_float<C>(op, to_c(x), (C)p0, (C)p1));
    }
};
template <typename T> struct UnaryImpl<T, false> {
    __device__ __forceinline__ static T run(int op, T x, double p0, double p1) {
        return unary_int<T>(op, x, sat_from_f64<T>(p0), sat_from_f64<T>(p1));
    }
};

template <typename T> __device__ __forceinline__ T binary_op(int op, T a, T b) {
    typedef typename Compute<T>::type C;
    if constexpr (IsFloat<T>::value) {
        C x = to_c(a), y = to_c(b);
        switch (op) {
            case B_ADD: return from_c<T>(x + y);
            case B_SUB: return from_c<T>(x - y);
            case B_MUL: return from_c<T>(x * y);
            case B_DIV: return from_c<T>(x / y);
            case B_MAX: return from_c<T>(k_max(x, y));
            case B_MIN: return from_c<T>(k_min(x, y));
            case B_RELU_GRAD: return y > (C)0 ? a : from_c<T>((C)0);
            case B_ADD_RELU: { C s = x + y; return from_c<T>(s <= (C)0 ? (C)0 : s); }
            case B_MUL_RELU: { C s = x * y; return from_c<T>(s <= (C)0 ? (C)0 : s); }
            case B_COUNT_FINITE: return isfinite(y) ? from_c<T>(x + (C)1) : a;
            default: return from_c<T>((C)k_pow((double)x, (double)y));
        }
    } else {
        switch (op) {
            case B_ADD: return (T)(a + b);
            case B_SUB: return (T)(a - b);
            case B_MUL: return (T)(a * b);
            case B_DIV: return int_div(a, b);
            case B_MAX: return a > b ? a : b;
            case B_RELU_GRAD: return b > (T)0 ? a : (T)0;
            case B_ADD_RELU: { T s = (T)(a + b); return s > (T)0 ? s : (T)0; }
            case B_MUL_RELU: { T s = (T)(a * b); return s > (T)0 ? s : (T)0; }
            case B_COUNT_FINITE: return (T)(a + (T)1);
            default: return a < b ? a : b;
        }
    }
}

template <typename T> __device__ __forceinline__ u8 cmp_op(int op, T a, T b) {
    typename Compute<T>::type x = to_c(a), y = to_c(b);
    switch (op) {
        case C_EQ: return x == y;
        case C_NE: return x != y;
        case C_LT: return x < y;
        case C_LE: return x <= y;
        case C_GT: return x > y;
        default: return x >= y;
    }
}

// ---- the generic drivers ----------------------------------------------------------------

// Grid-stride loop over `n` elements of K inputs and one output, calling f(i, offsets).
#define FOR_EACH_STRIDED(K, MODE, N, L, BODY)                                                    \
    {                                                                                            \
        u64 stride_ = (u64)blockDim.x * gridDim.x;                                               \
        if ((MODE) == 2) {                                                                       \
            for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < (u32)(N); i += (u32)stride_) { \
                u32 off[K];                                                                      \
                strided_offsets<K, u32>(i, L, off);                                              \
                BODY                                                                             \
            }                                                                                    \
        } else {                                                                                 \
            for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (N); i += stride_) {    \
                u64 off[K];                                                                      \
                strided_offsets<K, u64>(i, L, off);                                              \
                BODY                                                                             \
            }                                                                                    \
        }                                                                                        \
    }

// Vector paths keep UNROLL independent 16-byte loads in flight per thread before computing,
// so a bandwidth-bound op does not wait on one load at a time.
#define UNROLL 4

template <typename T, typename O, typename F>
__device__ __forceinline__ void map1(u64 n, const T* __restrict__ x, O* __restrict__ y, int mode, const Strided<2>& l, F f) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)blockDim.x * gridDim.x;
    if (mode == 0 && sizeof(T) == sizeof(O)) {
        const u64 V = 16 / sizeof(T), nv = n / V;
        const Pack<T>* __restrict__ xp = reinterpret_cast<const Pack<T>*>(x);
        Pack<O>* __restrict__ yp = reinterpret_cast<Pack<O>*>(y);
        for (u64 base = tid; base < nv; base += stride * UNROLL) {
            Pack<T> a[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                u64 i = base + u * stride;
                if (i < nv) a[u] = xp[i];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                u64 i = base + u * stride;
                if (i < nv) {
                    Pack<O> r;
#pragma unroll
                    for (int k = 0; k < (int)V; ++k) r.v[k] = f(a[u].v[k]);
                    yp[i] = r;
                }
            }
        }
        for (u64 i = nv * V + tid; i < n; i += stride) y[i] = f(x[i]);
    } else if (mode <= 1) {
        for (u64 i = tid; i < n; i += stride) y[i] = f(x[i]);
    } else {
        FOR_EACH_STRIDED(2, mode, n, l, { y[off[0]] = f(x[off[1]]); })
    }
}

template <typename T, typename O, typename F>
__device__ __forceinline__ void map2(u64 n, const T* __restrict__ a, const T* __restrict__ b, O* __restrict__ y, int mode,
                                     const Strided<3>& l, F f) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)blockDim.x * gridDim.x;
    if (mode == 0 && sizeof(T) == sizeof(O)) {
        const u64 V = 16 / sizeof(T), nv = n / V;
        const Pack<T>* __restrict__ ap = reinterpret_cast<const Pack<T>*>(a);
        const Pack<T>* __restrict__ bp = reinterpret_cast<const Pack<T>*>(b);
        Pack<O>* __restrict__ yp = reinterpret_cast<Pack<O>*>(y);
        for (u64 base = tid; base < nv; base += stride * UNROLL) {
            Pack<T> pa[UNROLL], pb[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                u64 i = base + u * stride;
                if (i < nv) { pa[u] = ap[i]; pb[u] = bp[i]; }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                u64 i = base + u * stride;
                if (i < nv) {
                    Pack<O> r;
#pragma unroll
                    for (int k = 0; k < (int)V; ++k) r.v[k] = f(pa[u].v[k], pb[u].v[k]);
                    yp[i] = r;
                }
            }
        }
        for (u64 i = nv * V + tid; i < n; i += stride) y[i] = f(a[i], b[i]);
    } else if (mode <= 1) {
        for (u64 i = tid; i < n; i += stride) y[i] = f(a[i], b[i]);
    } else {
        FOR_EACH_STRIDED(3, mode, n, l, { y[off[0]] = f(a[off[1]], b[off[2]]); })
    }
}

template <typename T> struct UnaryF {
    int op; double p0, p1;
    __device__ __forceinline__ T operator()(T x) const { return UnaryImpl<T, IsFloat<T>::value>::run(op, x, p0, p1); }
};
// The unary op fixed at compile time: the vector path of each float dtype dispatches once per
// kernel to one of these, so the unrolled loop holds no per-element switch.
template <typename T, int OP> struct UnaryFixed {
    typename Compute<T>::type p0, p1;
    __device__ __forceinline__ T operator()(T x) const {
        return from_c<T>(unary_float<typename Compute<T>::type>(OP, to_c(x), p0, p1));
    }
};

#define UCASE(K) \
    case K: { UnaryFixed<T, K> f = {(C)p0, (C)p1}; map1<T, T>(n, x, y, 0, l, f); return; }

template <typename T>
__device__ __forceinline__ void unary_kernel(u64 n, const T* x, T* y, int op, double p0, double p1, int mode,
                                             const Strided<2>& l) {
#ifdef KILN_FIXED_OP
    // A module compiled for one op: the switches below fold to that op's code alone.
    op = KILN_FIXED_OP;
#endif
    if constexpr (IsFloat<T>::value) {
        typedef typename Compute<T>::type C;
        if (mode == 0) {
            switch (op) {
                // The ops of training loops and activations; the rest take the generic path.
                UCASE(U_NEG) UCASE(U_RELU) UCASE(U_EXP) UCASE(U_TANH) UCASE(U_SIGMOID) UCASE(U_GELU_ERF)
                UCASE(U_GELU_TANH) UCASE(U_SILU) UCASE(U_ADD_S) UCASE(U_MUL_S)
                default: break;
            }
        }
    }
    UnaryF<T> f = {op, p0, p1};
    map1<T, T>(n, x, y, mode, l, f);
}

template <typename T> struct BinaryF {
    int op;
    __device__ __forceinline__ T operator()(T a, T b) const { return binary_op<T>(op, a, b); }
};
template <typename T> struct CmpF {
    int op;
    __device__ __forceinline__ u8 operator()(T a, T b) const { return cmp_op<T>(op, a, b); }
};
template <typename O, typename I> struct CastF {
    __device__ __forceinline__ O operator()(I x) const { return Cast<O, I>::run(x); }
};

