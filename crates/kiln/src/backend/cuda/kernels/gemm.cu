// Small matrix products of kiln's own (see backend/cuda/gemm_small.rs): D = op(A)·op(B) in
// cuBLAS's column-major terms (D is m×n with ld = m, batch stride m·n), with an optional
// bias per row of D and ReLU. Meant for products with few outputs over a long inner
// dimension (the MLP's 256×128 over K = 784, its 10×128 weight gradient), where cuBLASLt's
// choices leave most SMs idle: each block computes a 16×16 tile of D with the inner
// dimension split over SLICES groups of threads, and adds the groups' partial sums in a fixed
// order (deterministic). The plan's tuner times it against cuBLASLt's candidates.

#define TILE 16
#define SLICES 4

template <typename T>
__device__ __forceinline__ void gemm_small_impl(T* __restrict__ d, const T* __restrict__ a, const T* __restrict__ b,
                                                const T* __restrict__ bias, u64 m, u64 n, u64 k, u64 lda, u64 ldb,
                                                u64 a_batch, u64 b_batch, int ta, int tb, int relu) {
    __shared__ float partial[SLICES][TILE][TILE + 1];
    u32 tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
    u64 i = (u64)blockIdx.x * TILE + tx;
    u64 j = (u64)blockIdx.y * TILE + ty;
    u64 batch = blockIdx.z;
    a += batch * a_batch;
    b += batch * b_batch;
    float sum = 0.f;
    if (i < m && j < n) {
        // op(A)[i, kk] and op(B)[kk, j] in column-major storage.
        u64 a_step = ta ? 1 : lda, b_step = tb ? ldb : 1;
        const T* ap = a + (ta ? i * lda : i);
        const T* bp = b + (tb ? j : j * ldb);
        u64 chunk = (k + SLICES - 1) / SLICES;
        u64 k0 = tz * chunk, k1 = k0 + chunk < k ? k0 + chunk : k;
        for (u64 kk = k0; kk < k1; kk++) sum += (float)ap[kk * a_step] * (float)bp[kk * b_step];
    }
    partial[tz][ty][tx] = sum;
    __syncthreads();
    if (tz == 0 && i < m && j < n) {
        float r = partial[0][ty][tx];
        for (u32 s = 1; s < SLICES; s++) r += partial[s][ty][tx];
        if (bias) r += (float)bias[i];
        if (relu) r = r > 0.f ? r : 0.f;
        d[batch * m * n + j * m + i] = (T)r;
    }
}

#define GEMM_FOR(T, NAME)                                                                                            \
    extern "C" __global__ void __launch_bounds__(TILE * TILE * SLICES)                                              \
        gemm_small_##NAME(T* d, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias, u64 m, \
                          u64 n, u64 k, u64 lda, u64 ldb, u64 a_batch, u64 b_batch, int ta, int tb, int relu) {      \
        gemm_small_impl<T>(d, a, b, bias, m, n, k, lda, ldb, a_batch, b_batch, ta, tb, relu);                       \
    }

GEMM_FOR(float, f32)
