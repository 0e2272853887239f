// Softmax and log-softmax over the rows of a contiguous [rows, cols] tensor, one block per
// row. Rows that fit (ITEMS values per thread) are read once into registers and written
// once; longer rows take the `big` kernel, which reads the row three times.

__device__ __forceinline__ float k_exp(float x) { return expf(x); }
__device__ __forceinline__ double k_exp(double x) { return exp(x); }
__device__ __forceinline__ float k_log(float x) { return logf(x); }
__device__ __forceinline__ double k_log(double x) { return log(x); }

template <typename C> __device__ __forceinline__ C warp_max(C v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) { C o = shfl_xor(v, m); v = (v != v || v > o) ? v : o; }
    return v;
}
template <typename C> __device__ __forceinline__ C warp_sum(C v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
}
// Block max or sum, broadcast to every thread.
template <typename C, bool MAX> __device__ __forceinline__ C block_all(C v) {
    __shared__ C sh[32];
    __shared__ C result;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        C w = lane < nw ? sh[lane] : (MAX ? sh[0] : (C)0);
        w = MAX ? warp_max(w) : warp_sum(w);
        if (lane == 0) result = w;
    }
    __syncthreads();
    return result;
}

template <typename T, int N> struct alignas(N * sizeof(T)) PackN { T v[N]; };

// Each thread holds ITEMS values: VEC-wide packs at positions (threadIdx.x + k * blockDim.x) * VEC.
template <typename T, int ITEMS, int VEC>
__device__ void softmax_regs(const T* x, T* y, u64 cols, int log_) {
    typedef typename Compute<T>::type C;
    const T* row = x + (u64)blockIdx.x * cols;
    T* out = y + (u64)blockIdx.x * cols;
    C v[ITEMS];
    C m = -__int_as_float(0x7f800000);  // -inf
#pragma unroll
    for (int k = 0; k < ITEMS / VEC; ++k) {
        u64 j = ((u64)threadIdx.x + (u64)k * blockDim.x) * VEC;
        if (j < cols) {
            if (VEC > 1) {
                PackN<T, VEC> p = *reinterpret_cast<const PackN<T, VEC>*>(row + j);
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[k * VEC + e] = to_c(p.v[e]);
            } else {
                v[k] = to_c(row[j]);
            }
#pragma unroll
            for (int e = 0; e < VEC; ++e) { C t = v[k * VEC + e]; m = (t != t || t > m) ? t : m; }
        }
    }
    m = block_all<C, true>(m);
    // A row whose max is not finite is NaN throughout, as in PyTorch: m - m is NaN then.
    C shift = (m - m == (C)0) ? m : m - m;
    C s = 0;
#pragma unroll
    for (int k = 0; k < ITEMS / VEC; ++k) {
        u64 j = ((u64)threadIdx.x + (u64)k * blockDim.x) * VEC;
        if (j < cols) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) { v[k * VEC + e] -= shift; s += k_exp(v[k * VEC + e]); }
        }
    }
    s = block_all<C, false>(s);
    C ls = k_log(s), inv = (C)1 / s;
#pragma unroll
    for (int k = 0; k < ITEMS / VEC; ++k) {
        u64 j = ((u64)threadIdx.x + (u64)k * blockDim.x) * VEC;
        if (j < cols) {
            PackN<T, VEC> p;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                C t = v[k * VEC + e];
                p.v[e] = from_c<T>(log_ ? t - ls : k_exp(t) * inv);
            }
            *reinterpret_cast<PackN<T, VEC>*>(out + j) = p;
        }
    }
}

template <typename T>
__device__ void softmax_big(const T* x, T* y, u64 cols, int log_) {
    typedef typename Compute<T>::type C;
    const T* row = x + (u64)blockIdx.x * cols;
    T* out = y + (u64)blockIdx.x * cols;
    C m = -__int_as_float(0x7f800000);
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) { C t = to_c(row[j]); m = (t != t || t > m) ? t : m; }
    m = block_all<C, true>(m);
    C shift = (m - m == (C)0) ? m : m - m;  // NaN rows, as above
    C s = 0;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) s += k_exp(to_c(row[j]) - shift);
    s = block_all<C, false>(s);
    C ls = k_log(s), inv = (C)1 / s;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) {
        C t = to_c(row[j]) - shift;
        out[j] = from_c<T>(log_ ? t - ls : k_exp(t) * inv);
    }
}

// Rows too long for registers but short enough for shared memory (up to ~227 KB of compute
// values on Hopper): read once into shared memory, then max, sum and write from there.
template <typename T>
__device__ void softmax_smem(const T* __restrict__ x, T* __restrict__ y, u64 cols, int log_) {
    typedef typename Compute<T>::type C;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    C* buf = reinterpret_cast<C*>(smem_raw);
    const T* row = x + (u64)blockIdx.x * cols;
    T* out = y + (u64)blockIdx.x * cols;
    const u64 V = 16 / sizeof(T);
    C m = -__int_as_float(0x7f800000);
    bool vec = (cols % V == 0) && ((u64)row % 16 == 0);
    if (vec) {
        // Four independent 16-byte loads in flight per thread: one block per SM needs them
        // to keep enough bytes moving.
        const u64 step = (u64)blockDim.x * V;
        for (u64 base = threadIdx.x * V; base < cols; base += 4 * step) {
            Pack<T> p[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (base + u * step < cols) p[u] = *reinterpret_cast<const Pack<T>*>(row + base + u * step);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                u64 j = base + u * step;
                if (j < cols) {
#pragma unroll
                    for (int e = 0; e < (int)V; ++e) { C t = to_c(p[u].v[e]); buf[j + e] = t; m = (t != t || t > m) ? t : m; }
                }
            }
        }
    } else {
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) { C t = to_c(row[j]); buf[j] = t; m = (t != t || t > m) ? t : m; }
    }
    m = block_all<C, true>(m);
    C shift = (m - m == (C)0) ? m : m - m;  // NaN rows, as above
    C s = 0;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) {
        C t = buf[j] - shift;
        C e = k_exp(t);
        buf[j] = log_ ? t : e;
        s += e;
    }
    s = block_all<C, false>(s);
    C ls = k_log(s), inv = (C)1 / s;
    bool vec_out = (cols % V == 0) && ((u64)out % 16 == 0);
    if (vec_out) {
        for (u64 j = threadIdx.x * V; j < cols; j += (u64)blockDim.x * V) {
            Pack<T> p;
#pragma unroll
            for (int e = 0; e < (int)V; ++e) p.v[e] = from_c<T>(log_ ? buf[j + e] - ls : buf[j + e] * inv);
            *reinterpret_cast<Pack<T>*>(out + j) = p;
        }
    } else {
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) out[j] = from_c<T>(log_ ? buf[j] - ls : buf[j] * inv);
    }
}

// ln Σ e^x of each row, one block per row: the max, then the sum of exponentials (the second
// read mostly from L1/L2), 16-byte loads where the row is aligned. The shift is the CPU's:
// a row holding +inf gives +inf, a row of -inf gives -inf, NaN gives NaN.
template <typename T>
__device__ void logsumexp_row(const T* __restrict__ x, T* __restrict__ y, u64 cols) {
    typedef typename Compute<T>::type C;
    const T* row = x + (u64)blockIdx.x * cols;
    const u64 V = 16 / sizeof(T);
    const bool vec = (cols % V == 0) && ((u64)row % 16 == 0);
    C m = -__int_as_float(0x7f800000);
    if (vec) {
        for (u64 j = threadIdx.x * V; j < cols; j += (u64)blockDim.x * V) {
            Pack<T> p = *reinterpret_cast<const Pack<T>*>(row + j);
#pragma unroll
            for (int e = 0; e < (int)V; ++e) { C t = to_c(p.v[e]); m = (t != t || t > m) ? t : m; }
        }
    } else {
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) { C t = to_c(row[j]); m = (t != t || t > m) ? t : m; }
    }
    m = block_all<C, true>(m);
    C shift = (m - m == (C)0) ? m : (C)0;  // +-inf rows give +-inf, NaN rows NaN
    C s = 0;
    if (vec) {
        for (u64 j = threadIdx.x * V; j < cols; j += (u64)blockDim.x * V) {
            Pack<T> p = *reinterpret_cast<const Pack<T>*>(row + j);
#pragma unroll
            for (int e = 0; e < (int)V; ++e) s += k_exp(to_c(p.v[e]) - shift);
        }
    } else {
        for (u64 j = threadIdx.x; j < cols; j += blockDim.x) s += k_exp(to_c(row[j]) - shift);
    }
    s = block_all<C, false>(s);
    if (threadIdx.x == 0) y[blockIdx.x] = from_c<T>(k_log(s) + shift);
}

#define SOFTMAX_ITEMS(T, NAME, ITEMS, VEC)                                                                \
    extern "C" __global__ void softmax_##NAME##_##ITEMS(const T* x, T* y, u64 cols, int log_) {          \
        softmax_regs<T, ITEMS, VEC>(x, y, cols, log_);                                                   \
    }                                                                                                     \
    extern "C" __global__ void softmax_##NAME##_##ITEMS##_v(const T* x, T* y, u64 cols, int log_) {      \
        softmax_regs<T, ITEMS, (ITEMS < 16 / (int)sizeof(T) ? ITEMS : 16 / (int)sizeof(T))>(x, y, cols, log_); \
    }
#define SOFTMAX_FOR(T, NAME)                                                                              \
    SOFTMAX_ITEMS(T, NAME, 1, 1) SOFTMAX_ITEMS(T, NAME, 2, 1) SOFTMAX_ITEMS(T, NAME, 4, 1)               \
    SOFTMAX_ITEMS(T, NAME, 8, 1) SOFTMAX_ITEMS(T, NAME, 16, 1) SOFTMAX_ITEMS(T, NAME, 32, 1)             \
    extern "C" __global__ void softmax_##NAME##_big(const T* x, T* y, u64 cols, int log_) {              \
        softmax_big<T>(x, y, cols, log_);                                                                \
    }                                                                                                     \
    extern "C" __global__ void softmax_##NAME##_smem(const T* x, T* y, u64 cols, int log_) {             \
        softmax_smem<T>(x, y, cols, log_);                                                               \
    }                                                                                                     \
    extern "C" __global__ void logsumexp_##NAME(const T* x, T* y, u64 cols) { logsumexp_row<T>(x, y, cols); }

SOFTMAX_FOR(f16, f16)
SOFTMAX_FOR(bf16, bf16)
SOFTMAX_FOR(float, f32)
SOFTMAX_FOR(double, f64)
