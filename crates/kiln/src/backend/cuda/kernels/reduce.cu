// Reductions to (value, index) pairs. Keep op codes in sync with cuda/reduce.rs.
//   rows: x is [rows, cols], row r at x + r*rstride, its element j at stride estride (1 for
//         contiguous rows; the columns of a small [R, C] matrix are rows of stride C), reduce
//         each row; grid (rows, splits) with an optional second pass over the partials.
//   cols: x is [R, C] contiguous, reduce over R; grid (ceil(C / block), splits), likewise.
// An empty accumulator has index -1. Ties go to the smaller index and NaN wins, so the
// result does not depend on the order blocks and threads combine in.
#define R_SUM 0
#define R_MAX 1
#define R_MIN 2
#define R_ARGMAX 3
#define R_ARGMIN 4

template <typename C> struct Pair { C v; i64 i; };

template <typename C> __device__ __forceinline__ bool is_nan(C v) { return v != v; }

template <typename C> __device__ __forceinline__ Pair<C> combine(int op, Pair<C> a, Pair<C> b) {
    if (op == R_SUM) { Pair<C> r = {(C)(a.v + b.v), a.i < 0 ? b.i : a.i}; return r; }
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an || bn) return (an && (!bn || a.i < b.i)) ? a : b;
    bool max = (op == R_MAX || op == R_ARGMAX);
    bool b_better = max ? (b.v > a.v) : (b.v < a.v);
    if (b_better || (b.v == a.v && b.i < a.i)) return b;
    return a;
}

template <typename C> __device__ __forceinline__ Pair<C> empty_pair() { Pair<C> p = {(C)0, -1}; return p; }

template <typename C> __device__ __forceinline__ Pair<C> warp_reduce(int op, Pair<C> p) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        Pair<C> o = {shfl_xor(p.v, m), shfl_xor(p.i, m)};
        p = combine(op, p, o);
    }
    return p;
}

// Block-wide reduction; the result is valid in thread 0.
template <typename C> __device__ __forceinline__ Pair<C> block_reduce(int op, Pair<C> p) {
    __shared__ C sv[32];
    __shared__ i64 si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    p = warp_reduce(op, p);
    if (lane == 0) { sv[warp] = p.v; si[warp] = p.i; }
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    if (warp == 0) {
        Pair<C> q = empty_pair<C>();
        if (lane < nw) { q.v = sv[lane]; q.i = si[lane]; }
        p = warp_reduce(op, q);
    }
    return p;
}

template <typename T> __device__ __forceinline__ void write_out(int op, Pair<typename Compute<T>::type> p, T* out_v, i64* out_i, u64 at) {
    if (op >= R_ARGMAX) out_i[at] = p.i < 0 ? 0 : p.i;
    else out_v[at] = from_c<T>(p.v);
}

template <typename T>
__device__ void rows_impl(const T* x, u64 rows, u64 cols, u64 rstride, u64 estride, u64 chunk, int op, int vec,
                          typename Compute<T>::type* part_v, i64* part_i, T* out_v, i64* out_i) {
    typedef typename Compute<T>::type C;
    u64 r = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
    u64 begin = s * chunk, end = begin + chunk < cols ? begin + chunk : cols;
    const T* row = x + r * rstride;
    Pair<C> acc = empty_pair<C>();
    if (vec) {
        // begin and end are multiples of V and the row start is 16-byte aligned.
        const u64 V = 16 / sizeof(T);
        for (u64 j = begin + threadIdx.x * V; j < end; j += (u64)blockDim.x * V) {
            Pack<T> pk = *reinterpret_cast<const Pack<T>*>(row + j);
#pragma unroll
            for (int k = 0; k < (int)V; ++k) {
                Pair<C> e = {to_c(pk.v[k]), (i64)(j + k)};
                acc = combine(op, acc, e);
            }
        }
    } else {
        for (u64 j = begin + threadIdx.x; j < end; j += blockDim.x) {
            Pair<C> e = {to_c(row[j * estride]), (i64)j};
            acc = combine(op, acc, e);
        }
    }
    acc = block_reduce(op, acc);
    if (threadIdx.x == 0) {
        if (splits == 1) write_out<T>(op, acc, out_v, out_i, r);
        else { part_v[r * splits + s] = acc.v; part_i[r * splits + s] = acc.i; }
    }
}

template <typename T>
__device__ void parts_impl(const typename Compute<T>::type* pv, const i64* pi, u64 splits, int op, T* out_v, i64* out_i) {
    typedef typename Compute<T>::type C;
    u64 r = blockIdx.x;
    Pair<C> acc = empty_pair<C>();
    for (u64 j = threadIdx.x; j < splits; j += blockDim.x) {
        Pair<C> e = {pv[r * splits + j], pi[r * splits + j]};
        acc = combine(op, acc, e);
    }
    acc = block_reduce(op, acc);
    if (threadIdx.x == 0) write_out<T>(op, acc, out_v, out_i, r);
}

template <typename T>
__device__ void cols_impl(const T* x, const typename Compute<T>::type* in_pv, const i64* in_pi, u64 R, u64 Ccols,
                          u64 rchunk, int op, typename Compute<T>::type* part_v, i64* part_i, T* out_v, i64* out_i) {
    typedef typename Compute<T>::type C;
    u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y, splits = gridDim.y;
    if (c >= Ccols) return;
    u64 begin = s * rchunk, end = begin + rchunk < R ? begin + rchunk : R;
    Pair<C> acc = empty_pair<C>();
    for (u64 r = begin; r < end; ++r) {
        Pair<C> e;
        if (in_pv) { e.v = in_pv[r * Ccols + c]; e.i = in_pi[r * Ccols + c]; }
        else { e.v = to_c(x[r * Ccols + c]); e.i = (i64)r; }
        acc = combine(op, acc, e);
    }
    if (splits == 1) write_out<T>(op, acc, out_v, out_i, c);
    else { part_v[s * Ccols + c] = acc.v; part_i[s * Ccols + c] = acc.i; }
}

// planes: x is [outer, kept, inner] contiguous, reduce over outer and inner (a convolution's
// bias gradient: N and H·W around the channels). Grid (kept, splits): block (c, s) folds the
// planes b = s, s + splits, ... of kept index c into partial [c, s], for `parts` to finish.
// Short planes (under 1024 elements) go one warp each, eight planes in flight a block (a
// whole block on a 196-element plane left most threads idle and one load each in flight);
// long ones a block each. 16-byte loads where `vec`. Sum, max and min only (no argument
// reductions). One read of the input, where rows-then-cols took a block per plane and two
// more launches.
template <typename T>
__device__ void planes_impl(const T* x, u64 outer, u64 kept, u64 inner, int op, int vec,
                            typename Compute<T>::type* part_v, i64* part_i) {
    typedef typename Compute<T>::type C;
    const u64 c = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
    const u64 V = vec ? 16 / sizeof(T) : 1;
    const bool by_warp = inner < 1024;
    const u64 lane = by_warp ? (threadIdx.x & 31) : threadIdx.x, width = by_warp ? 32 : blockDim.x;
    const u64 first = by_warp ? s + (threadIdx.x >> 5) * splits : s;
    const u64 step = by_warp ? splits * (blockDim.x >> 5) : splits;
    Pair<C> acc = empty_pair<C>();
    for (u64 b = first; b < outer; b += step) {
        const T* plane = x + (b * kept + c) * inner;
        if (vec) {
            for (u64 j = lane * V; j < inner; j += width * V) {
                Pack<T> pk = *reinterpret_cast<const Pack<T>*>(plane + j);
#pragma unroll
                for (int k = 0; k < (int)(16 / sizeof(T)); ++k) {
                    Pair<C> e = {to_c(pk.v[k]), (i64)0};
                    acc = combine(op, acc, e);
                }
            }
        } else {
            for (u64 j = lane; j < inner; j += width) {
                Pair<C> e = {to_c(plane[j]), (i64)0};
                acc = combine(op, acc, e);
            }
        }
    }
    acc = block_reduce(op, acc);
    if (threadIdx.x == 0) { part_v[c * splits + s] = acc.v; part_i[c * splits + s] = acc.i; }
}

#define REDUCE_FOR(T, NAME)                                                                              \
    extern "C" __global__ void reduce_rows_##NAME(const T* x, u64 rows, u64 cols, u64 rstride, u64 estride, \
                                                  u64 chunk, int op, int vec, Compute<T>::type* pv, i64* pi, \
                                                  T* ov, i64* oi) {                                      \
        rows_impl<T>(x, rows, cols, rstride, estride, chunk, op, vec, pv, pi, ov, oi);                  \
    }                                                                                                    \
    extern "C" __global__ void reduce_parts_##NAME(const Compute<T>::type* pv, const i64* pi, u64 splits, \
                                                   int op, T* ov, i64* oi) {                            \
        parts_impl<T>(pv, pi, splits, op, ov, oi);                                                      \
    }                                                                                                    \
    extern "C" __global__ void reduce_cols_##NAME(const T* x, const Compute<T>::type* in_pv, const i64* in_pi, \
                                                  u64 R, u64 C, u64 rchunk, int op, Compute<T>::type* pv, \
                                                  i64* pi, T* ov, i64* oi) {                            \
        cols_impl<T>(x, in_pv, in_pi, R, C, rchunk, op, pv, pi, ov, oi);                                \
    }                                                                                                    \
    extern "C" __global__ void reduce_planes_##NAME(const T* x, u64 outer, u64 kept, u64 inner, int op,   \
                                                    int vec, Compute<T>::type* pv, i64* pi) {           \
        planes_impl<T>(x, outer, kept, inner, op, vec, pv, pi);                                          \
    }

REDUCE_FOR(f16, f16)
REDUCE_FOR(bf16, bf16)
REDUCE_FOR(float, f32)
REDUCE_FOR(double, f64)
REDUCE_FOR(u8, u8)
REDUCE_FOR(u32, u32)
REDUCE_FOR(i64, i64)
