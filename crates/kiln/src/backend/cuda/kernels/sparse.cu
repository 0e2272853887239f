// CSR products (see backend/cuda/sparse.rs). `T` is the value type, `I` the index type (u32
// or i64), `C` the compute type. Rows longer than LONG_ROW are skipped by the row kernels and
// computed by the piece kernels (one warp per piece of at most LONG_ROW_PIECE entries); the
// pieces' partial sums go to a scratch buffer that `csr_finish` adds up per row, so every
// output element is written once, deterministically. Dense operands are row-major with a
// leading dimension (`ld*`) and unit column stride.

#define LONG_ROW 64
#define WARP 32

template <typename T> using C_ = typename Compute<T>::type;

// Sum over V lanes (V a power of two, groups aligned within the warp; every lane calls).
template <typename C> __device__ __forceinline__ C group_sum(C v, u32 lanes) {
    for (u32 off = lanes / 2; off > 0; off /= 2) v += shfl_xor(v, (int)off);
    return v;
}

__device__ __forceinline__ u64 warp_id() { return ((u64)blockIdx.x * blockDim.x + threadIdx.x) / WARP; }
__device__ __forceinline__ u32 lane_id() { return threadIdx.x % WARP; }

// `alpha·sum + beta·yin[i]` rounded to T (yin unread when beta == 0).
template <typename T>
__device__ __forceinline__ T finish_value(C_<T> sum, double alpha, double beta, const T* yin, u64 i) {
    C_<T> r = (C_<T>)alpha * sum;
    if (beta != 0.0) r += (C_<T>)beta * to_c(yin[i]);
    return from_c<T>(r);
}

// ---- y = alpha·A·x + beta·y, one column ---------------------------------------------------
// `lanes` consecutive threads per row.
template <typename T, typename I>
__device__ void spmv_rows_impl(const I* rp, const I* ci, const T* v, const T* x, u64 ldx, T* y, u64 rows,
                               double alpha, double beta, const T* yin, u64 ldy, u32 lanes) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / lanes;
    u32 lane = (u32)(t % lanes);
    u64 s = 0, e = 0;
    if (row < rows) { s = (u64)rp[row]; e = (u64)rp[row + 1]; }
    bool is_long = e - s > LONG_ROW;
    C_<T> sum = 0;
    if (!is_long) {
        for (u64 k = s + lane; k < e; k += lanes) sum += to_c(v[k]) * to_c(x[(u64)ci[k] * ldx]);
    }
    sum = group_sum(sum, lanes);
    if (row < rows && lane == 0 && !is_long) y[row * ldy] = finish_value<T>(sum, alpha, beta, yin, row * ldy);
}

// One warp per piece: the piece's partial sum.
template <typename T, typename I>
__device__ void spmv_pieces_impl(const i64* pieces, u64 n_pieces, const I* ci, const T* v, const T* x, u64 ldx,
                                 C_<T>* partial) {
    u64 p = warp_id();
    u32 lane = lane_id();
    C_<T> sum = 0;
    if (p < n_pieces) {
        u64 s = (u64)pieces[3 * p + 1], e = (u64)pieces[3 * p + 2];
        for (u64 k = s + lane; k < e; k += WARP) sum += to_c(v[k]) * to_c(x[(u64)ci[k] * ldx]);
    }
    sum = group_sum(sum, WARP);
    if (p < n_pieces && lane == 0) partial[p] = sum;
}

// ---- Y = alpha·A·X + beta·Y, n columns --------------------------------------------------
// G lanes (a power of two up to 32) compute one row's tile of V·G columns (blockIdx.y picks
// the tile), V per lane. With VEC (X's rows 16-byte aligned, n a multiple of V = 16 bytes of
// T) lane g holds columns j0 + V·g .. + V and reads them with one 16-byte load per entry;
// otherwise it holds columns j0 + g + G·i (i < 4), read one by one. Every lane of a group
// reads the (column, value) pairs itself (one transaction per group, no shuffles), and four
// entries' X rows are requested before any is used, to keep gathers in flight.
template <typename T, bool VEC> struct PerLane { static constexpr int V = VEC ? (int)(16 / sizeof(T)) : 4; };

template <typename T, bool VEC> struct alignas(VEC ? 16 : alignof(T)) XCols { T e[PerLane<T, VEC>::V]; };

template <typename T, bool VEC>
__device__ __forceinline__ XCols<T, VEC> load_cols(const T* x, u64 ldx, u64 c, u64 j0, u32 g, u32 G, u64 n) {
    constexpr int V = PerLane<T, VEC>::V;
    XCols<T, VEC> out;
    if constexpr (VEC) {
        uint4 raw = __ldg(reinterpret_cast<const uint4*>(x + c * ldx + j0 + (u64)V * g));
        out = *reinterpret_cast<XCols<T, VEC>*>(&raw);
    } else {
        const T* xr = x + c * ldx + j0 + g;
#pragma unroll
        for (int i = 0; i < V; ++i) out.e[i] = j0 + g + (u64)G * i < n ? xr[(u64)G * i] : from_c<T>(0);
    }
    return out;
}

// acc += A[k]·X[ci[k], lane's columns] for k = s, s + step, ... < e.
template <typename T, typename I, bool VEC>
__device__ __forceinline__ void mm_entries(u64 s, u64 e, u64 step, const I* ci, const T* v, const T* x, u64 ldx,
                                           u64 n, u64 j0, u32 g, u32 G, C_<T> (&acc)[PerLane<T, VEC>::V]) {
    constexpr int V = PerLane<T, VEC>::V;
    u64 k = s;
    for (; k + 3 * step < e; k += 4 * step) {
        u64 c[4];
        C_<T> w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) { c[q] = (u64)ci[k + q * step]; w[q] = to_c(v[k + q * step]); }
        XCols<T, VEC> xs[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) xs[q] = load_cols<T, VEC>(x, ldx, c[q], j0, g, G, n);
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] += w[q] * to_c(xs[q].e[i]);
    }
    for (; k < e; k += step) {
        C_<T> w = to_c(v[k]);
        XCols<T, VEC> xs = load_cols<T, VEC>(x, ldx, (u64)ci[k], j0, g, G, n);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += w * to_c(xs.e[i]);
    }
}

// The column of accumulator i of lane g in the tile at j0.
template <typename T, bool VEC> __device__ __forceinline__ u64 lane_col(u64 j0, u32 g, u32 G, int i) {
    return VEC ? j0 + (u64)PerLane<T, VEC>::V * g + i : j0 + g + (u64)G * i;
}

template <typename T, typename I, bool VEC>
__device__ void spmm_rows_impl(const I* rp, const I* ci, const T* v, const T* x, u64 ldx, u64 n, T* y, u64 rows,
                               double alpha, double beta, const T* yin, u64 ldy, u32 G) {
    constexpr int V = PerLane<T, VEC>::V;
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / G;
    u32 g = (u32)(t % G);
    u64 j0 = (u64)blockIdx.y * V * G;
    if (row >= rows || (VEC && lane_col<T, VEC>(j0, g, G, 0) >= n)) return;
    u64 s = (u64)rp[row], e = (u64)rp[row + 1];
    if (e - s > LONG_ROW) return;
    C_<T> acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0;
    mm_entries<T, I, VEC>(s, e, 1, ci, v, x, ldx, n, j0, g, G, acc);
    if constexpr (VEC) {
        // Y's rows are 16-byte aligned too (ldy is a multiple of V).
        XCols<T, VEC> o;
        u64 at = row * ldy + lane_col<T, VEC>(j0, g, G, 0);
#pragma unroll
        for (int i = 0; i < V; ++i) o.e[i] = finish_value<T>(acc[i], alpha, beta, yin, at + i);
        *reinterpret_cast<uint4*>(y + at) = *reinterpret_cast<uint4*>(&o);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) {
            u64 col = lane_col<T, VEC>(j0, g, G, i);
            if (col < n) y[row * ldy + col] = finish_value<T>(acc[i], alpha, beta, yin, row * ldy + col);
        }
    }
}

// One warp per (piece, tile): its 32 / G groups of G lanes take every (32 / G)-th entry, then
// add up across groups.
template <typename T, typename I, bool VEC>
__device__ void spmm_pieces_impl(const i64* pieces, u64 n_pieces, const I* ci, const T* v, const T* x, u64 ldx,
                                 u64 n, C_<T>* partial, u32 G) {
    constexpr int V = PerLane<T, VEC>::V;
    u64 p = warp_id();
    u32 lane = lane_id();
    if (p >= n_pieces) return;  // whole warps leave together
    u32 g = lane % G, sub = lane / G;
    u64 j0 = (u64)blockIdx.y * V * G;
    bool live = !VEC || lane_col<T, VEC>(j0, g, G, 0) < n;
    C_<T> acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0;
    if (live) mm_entries<T, I, VEC>((u64)pieces[3 * p + 1] + sub, (u64)pieces[3 * p + 2], WARP / G, ci, v, x, ldx, n,
                                    j0, g, G, acc);
    for (u32 off = G; off < WARP; off *= 2)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += shfl_xor(acc[i], (int)off);
    if (sub != 0 || !live) return;
#pragma unroll
    for (int i = 0; i < V; ++i) {
        u64 col = lane_col<T, VEC>(j0, g, G, i);
        if (col < n) partial[p * n + col] = acc[i];
    }
}

// One thread per (piece, column) for the first piece of each long row: the row's total.
template <typename T>
__device__ void finish_impl(const i64* pieces, u64 n_pieces, const C_<T>* partial, u64 n, T* y, double alpha,
                            double beta, const T* yin, u64 ldy) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_pieces * n) return;
    u64 p = t / n, col = t % n;
    i64 row = pieces[3 * p];
    if (p > 0 && pieces[3 * (p - 1)] == row) return;
    C_<T> sum = 0;
    for (u64 q = p; q < n_pieces && pieces[3 * q] == row; ++q) sum += partial[q * n + col];
    y[(u64)row * ldy + col] = finish_value<T>(sum, alpha, beta, yin, (u64)row * ldy + col);
}

// ---- Aᵀ·X: scatter with atomics into a compute-type accumulator ---------------------------
// acc[c·n + j] += alpha·v·X[row, j] for the entries of [s, e) of `row`, lanes over entries
// (n == 1, `lanes` per row) or over columns (n > 1, a warp).
template <typename T, typename I>
__device__ __forceinline__ void scatter_range(u64 row, u64 s, u64 e, const I* ci, const T* v, const T* x, u64 ldx,
                                              u64 n, C_<T>* acc, double alpha, u32 lane, u32 lanes) {
    C_<T> a = (C_<T>)alpha;
    if (n == 1) {
        C_<T> xr = a * to_c(x[row * ldx]);
        for (u64 k = s + lane; k < e; k += lanes) atomicAdd(acc + (u64)ci[k], to_c(v[k]) * xr);
        return;
    }
    const T* xr = x + row * ldx;
    for (u64 k = s; k < e; ++k) {
        u64 c = (u64)ci[k];
        C_<T> w = a * to_c(v[k]);
        for (u64 j = lane; j < n; j += WARP) atomicAdd(acc + c * n + j, w * to_c(xr[j]));
    }
}

template <typename T, typename I>
__device__ void spmm_t_rows_impl(const I* rp, const I* ci, const T* v, const T* x, u64 ldx, u64 n, C_<T>* acc,
                                 u64 rows, double alpha, u32 lanes) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / lanes;
    if (row >= rows) return;
    u64 s = (u64)rp[row], e = (u64)rp[row + 1];
    if (e - s > LONG_ROW) return;
    scatter_range(row, s, e, ci, v, x, ldx, n, acc, alpha, (u32)(t % lanes), lanes);
}

template <typename T, typename I>
__device__ void spmm_t_pieces_impl(const i64* pieces, u64 n_pieces, const I* ci, const T* v, const T* x, u64 ldx,
                                   u64 n, C_<T>* acc, double alpha) {
    u64 p = warp_id();
    if (p >= n_pieces) return;
    scatter_range((u64)pieces[3 * p], (u64)pieces[3 * p + 1], (u64)pieces[3 * p + 2], ci, v, x, ldx, n, acc, alpha,
                  lane_id(), WARP);
}

// acc[i·n + j] = beta·yin[i·ldy + j] (or 0).
template <typename T>
__device__ void acc_init_impl(C_<T>* acc, u64 m, u64 n, double beta, const T* yin, u64 ldy) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m * n) return;
    u64 i = t / n, j = t % n;
    acc[t] = beta != 0.0 ? (C_<T>)beta * to_c(yin[i * ldy + j]) : (C_<T>)0;
}

// ---- out[k] = L[row k]·R[col k] (the values' gradient) --------------------------------------
template <typename T, typename I>
__device__ __forceinline__ void sampled_range(u64 row, u64 s, u64 e, const I* ci, const T* l, u64 ldl, const T* r,
                                              u64 ldr, u64 n, T* out, u32 lane, u32 lanes) {
    if (n == 1) {
        C_<T> lr = to_c(l[row * ldl]);
        for (u64 k = s + lane; k < e; k += lanes) out[k] = from_c<T>(lr * to_c(r[(u64)ci[k] * ldr]));
        return;
    }
    for (u64 k = s; k < e; ++k) {
        const T* rr = r + (u64)ci[k] * ldr;
        const T* lr = l + row * ldl;
        C_<T> d = 0;
        for (u64 j = lane; j < n; j += WARP) d += to_c(lr[j]) * to_c(rr[j]);
        d = group_sum(d, WARP);
        if (lane == 0) out[k] = from_c<T>(d);
    }
}

template <typename T, typename I>
__device__ void sampled_rows_impl(const I* rp, const I* ci, const T* l, u64 ldl, const T* r, u64 ldr, u64 n, T* out,
                                  u64 rows, u32 lanes) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / lanes;
    if (row >= rows) return;  // n > 1 uses whole warps, which leave together
    u64 s = (u64)rp[row], e = (u64)rp[row + 1];
    if (e - s > LONG_ROW) return;
    sampled_range(row, s, e, ci, l, ldl, r, ldr, n, out, (u32)(t % lanes), lanes);
}

template <typename T, typename I>
__device__ void sampled_pieces_impl(const i64* pieces, u64 n_pieces, const I* ci, const T* l, u64 ldl, const T* r,
                                    u64 ldr, u64 n, T* out) {
    u64 p = warp_id();
    if (p >= n_pieces) return;
    sampled_range((u64)pieces[3 * p], (u64)pieces[3 * p + 1], (u64)pieces[3 * p + 2], ci, l, ldl, r, ldr, n, out,
                  lane_id(), WARP);
}

// SpMM entry points, scalar (VEC false) and 16-byte (VEC true) column loads.
#define SPMM_KERNELS(T, NAME, I, INAME, SUFFIX, VEC)                                                                 \
    extern "C" __global__ void spmm_rows##SUFFIX##_##NAME##_##INAME(                                                 \
        const I* __restrict__ rp, const I* __restrict__ ci, const T* __restrict__ v, const T* __restrict__ x, u64 ldx, \
        u64 n, T* y, u64 rows, double alpha, double beta, const T* __restrict__ yin, u64 ldy, u32 group) {           \
        spmm_rows_impl<T, I, VEC>(rp, ci, v, x, ldx, n, y, rows, alpha, beta, yin, ldy, group);                      \
    }                                                                                                                \
    extern "C" __global__ void spmm_pieces##SUFFIX##_##NAME##_##INAME(                                               \
        const i64* __restrict__ pieces, u64 np, const I* __restrict__ ci, const T* __restrict__ v,                    \
        const T* __restrict__ x, u64 ldx, u64 n, C_<T>* partial, u32 group) {                                       \
        spmm_pieces_impl<T, I, VEC>(pieces, np, ci, v, x, ldx, n, partial, group);                                   \
    }

#define SPARSE_INDEX(T, NAME, I, INAME)                                                                            \
    extern "C" __global__ void spmv_rows_##NAME##_##INAME(const I* __restrict__ rp, const I* __restrict__ ci, const T* __restrict__ v, const T* __restrict__ x, u64 ldx, \
                                                          T* y, u64 rows, double alpha, double beta, const T* __restrict__ yin,  \
                                                          u64 ldy, u32 lanes) {                                     \
        spmv_rows_impl<T, I>(rp, ci, v, x, ldx, y, rows, alpha, beta, yin, ldy, lanes);                              \
    }                                                                                                                \
    extern "C" __global__ void spmv_pieces_##NAME##_##INAME(const i64* __restrict__ pieces, u64 np, const I* __restrict__ ci, const T* __restrict__ v,     \
                                                            const T* __restrict__ x, u64 ldx, C_<T>* partial) {                 \
        spmv_pieces_impl<T, I>(pieces, np, ci, v, x, ldx, partial);                                                  \
    }                                                                                                                \
    SPMM_KERNELS(T, NAME, I, INAME, , false)                                                                         \
    SPMM_KERNELS(T, NAME, I, INAME, _vec, true)                                                                      \
    extern "C" __global__ void spmm_t_rows_##NAME##_##INAME(const I* __restrict__ rp, const I* __restrict__ ci, const T* __restrict__ v, const T* __restrict__ x,       \
                                                            u64 ldx, u64 n, C_<T>* acc, u64 rows, double alpha,    \
                                                            u32 lanes) {                                            \
        spmm_t_rows_impl<T, I>(rp, ci, v, x, ldx, n, acc, rows, alpha, lanes);                                       \
    }                                                                                                                \
    extern "C" __global__ void spmm_t_pieces_##NAME##_##INAME(const i64* __restrict__ pieces, u64 np, const I* __restrict__ ci, const T* __restrict__ v,   \
                                                              const T* __restrict__ x, u64 ldx, u64 n, C_<T>* acc,              \
                                                              double alpha) {                                       \
        spmm_t_pieces_impl<T, I>(pieces, np, ci, v, x, ldx, n, acc, alpha);                                          \
    }                                                                                                                \
    extern "C" __global__ void sampled_rows_##NAME##_##INAME(const I* __restrict__ rp, const I* __restrict__ ci, const T* __restrict__ l, u64 ldl,         \
                                                             const T* __restrict__ r, u64 ldr, u64 n, T* out, u64 rows,          \
                                                             u32 lanes) {                                           \
        sampled_rows_impl<T, I>(rp, ci, l, ldl, r, ldr, n, out, rows, lanes);                                        \
    }                                                                                                                \
    extern "C" __global__ void sampled_pieces_##NAME##_##INAME(const i64* __restrict__ pieces, u64 np, const I* __restrict__ ci, const T* __restrict__ l,  \
                                                               u64 ldl, const T* __restrict__ r, u64 ldr, u64 n, T* out) {       \
        sampled_pieces_impl<T, I>(pieces, np, ci, l, ldl, r, ldr, n, out);                                           \
    }

#define SPARSE_FOR(T, NAME)                                                                                          \
    SPARSE_INDEX(T, NAME, u32, u32)                                                                                  \
    SPARSE_INDEX(T, NAME, i64, i64)                                                                                  \
    extern "C" __global__ void csr_finish_##NAME(const i64* __restrict__ pieces, u64 np, const C_<T>* partial, u64 n, T* y,      \
                                                 double alpha, double beta, const T* __restrict__ yin, u64 ldy) {                \
        finish_impl<T>(pieces, np, partial, n, y, alpha, beta, yin, ldy);                                            \
    }                                                                                                                \
    extern "C" __global__ void csr_acc_init_##NAME(C_<T>* acc, u64 m, u64 n, double beta, const T* __restrict__ yin, u64 ldy) {  \
        acc_init_impl<T>(acc, m, n, beta, yin, ldy);                                                                 \
    }

SPARSE_FOR(f16, f16)
SPARSE_FOR(bf16, bf16)
SPARSE_FOR(float, f32)
SPARSE_FOR(double, f64)
