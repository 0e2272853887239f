// index_select, gather and scatter-add. Indices arrive as contiguous i64; an index outside
// [0, size) raises the device error flag (code 1) and reads nothing; index_select and gather
// write 0 there (the result is refused at the next read, but the memory is defined), and
// scatter-add adds nothing.

template <typename T>
__device__ __forceinline__ void index_select_impl(const T* x, const i64* ids, T* y, u64 outer, u64 n_ids,
                                                  u64 dim_size, u64 inner, u32* flag) {
    u64 n = outer * n_ids * inner;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (u64)blockDim.x * gridDim.x) {
        u64 i = t % inner, rest = t / inner, j = rest % n_ids, o = rest / n_ids;
        i64 id = ids[j];
        if (id < 0 || (u64)id >= dim_size) { raise_flag(flag, 1); y[t] = T{}; continue; }
        y[t] = x[(o * dim_size + (u64)id) * inner + i];
    }
}

// `l` walks the index tensor's shape with the strides of x (gather) or of the output
// (scatter) and stride 0 on `dim`; the index adds `ids[i] * dim_stride`.
template <typename T>
__device__ __forceinline__ void gather_impl(const T* x, const i64* ids, T* y, u64 n, Strided<1> l, u64 dim_stride,
                                            u64 dim_size, u32* flag) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (u64)blockDim.x * gridDim.x) {
        u64 off[1];
        strided_offsets<1, u64>(t, l, off);
        i64 id = ids[t];
        if (id < 0 || (u64)id >= dim_size) { raise_flag(flag, 1); y[t] = T{}; continue; }
        y[t] = x[off[0] + (u64)id * dim_stride];
    }
}

// Atomic adds for every dtype: native where the hardware has them, a compare-and-swap on
// the enclosing 32-bit word for 8- and 16-bit types.
__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(u32* p, u32 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i64* p, i64 v) { atomicAdd((u64*)p, (u64)v); }
template <typename T> __device__ __forceinline__ T add_bits(T a, T b);
template <> __device__ __forceinline__ f16 add_bits<f16>(f16 a, f16 b) { return from_c<f16>(to_c(a) + to_c(b)); }
template <> __device__ __forceinline__ bf16 add_bits<bf16>(bf16 a, bf16 b) { return from_c<bf16>(to_c(a) + to_c(b)); }
template <> __device__ __forceinline__ u8 add_bits<u8>(u8 a, u8 b) { return (u8)(a + b); }
template <typename T> __device__ __forceinline__ void atomic_add_narrow(T* p, T v) {
    u64 addr = (u64)p;
    u32* word = (u32*)(addr & ~(u64)3);
    u32 shift = (u32)(addr & 3) * 8, mask = ((1u << (8 * sizeof(T))) - 1) << shift;
    u32 old = *word, assumed;
    do {
        assumed = old;
        T cur;
        u32 bits = (assumed & mask) >> shift;
        if (sizeof(T) == 1) { *(u8*)&cur = (u8)bits; } else { *(unsigned short*)&cur = (unsigned short)bits; }
        T sum = add_bits<T>(cur, v);
        u32 nb = sizeof(T) == 1 ? (u32)*(u8*)&sum : (u32)*(unsigned short*)&sum;
        old = atomicCAS(word, assumed, (assumed & ~mask) | (nb << shift));
    } while (old != assumed);
}
__device__ __forceinline__ void atomic_add(f16* p, f16 v) { atomic_add_narrow(p, v); }
__device__ __forceinline__ void atomic_add(bf16* p, bf16 v) { atomic_add_narrow(p, v); }
__device__ __forceinline__ void atomic_add(u8* p, u8 v) { atomic_add_narrow(p, v); }

template <typename T>
__device__ __forceinline__ void scatter_add_impl(T* out, const i64* ids, const T* src, u64 n, Strided<1> l,
                                                 u64 dim_stride, u64 dim_size, u32* flag) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (u64)blockDim.x * gridDim.x) {
        u64 off[1];
        strided_offsets<1, u64>(t, l, off);
        i64 id = ids[t];
        if (id < 0 || (u64)id >= dim_size) { raise_flag(flag, 1); continue; }
        atomic_add(out + off[0] + (u64)id * dim_stride, src[t]);
    }
}

#define INDEX_FOR(T, NAME)                                                                                  \
    extern "C" __global__ void index_select_##NAME(const T* x, const i64* ids, T* y, u64 outer, u64 n_ids,  \
                                                   u64 dim_size, u64 inner, u32* flag) {                    \
        index_select_impl<T>(x, ids, y, outer, n_ids, dim_size, inner, flag);                              \
    }                                                                                                        \
    extern "C" __global__ void gather_##NAME(const T* x, const i64* ids, T* y, u64 n, Strided<1> l,        \
                                             u64 dim_stride, u64 dim_size, u32* flag) {                     \
        gather_impl<T>(x, ids, y, n, l, dim_stride, dim_size, flag);                                        \
    }                                                                                                        \
    extern "C" __global__ void scatter_add_##NAME(T* out, const i64* ids, const T* src, u64 n, Strided<1> l, \
                                                  u64 dim_stride, u64 dim_size, u32* flag) {                \
        scatter_add_impl<T>(out, ids, src, n, l, dim_stride, dim_size, flag);                               \
    }

INDEX_FOR(f16, f16)
INDEX_FOR(bf16, bf16)
INDEX_FOR(float, f32)
INDEX_FOR(double, f64)
INDEX_FOR(u8, u8)
INDEX_FOR(u32, u32)
INDEX_FOR(i64, i64)
