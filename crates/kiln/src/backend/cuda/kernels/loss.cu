// Fused softmax cross-entropy: one warp per row of logits x [n, c] (any strides), labels
// t [n] (i64, stride ts). With q = (1-e)*onehot(label) + e/c:
//   loss[i]    = scale * (logsumexp(x_i) - sum_j q_j x_ij)
//   grad[i, j] = scale * (softmax(x_i)_j - q_j)          (contiguous [n, c])
//   correct[i] = 1 if the first maximum of x_i is at the label (NaN counts as the maximum)
// A label outside [0, c) raises the device error flag (code 2); its row gets NaN.

template <typename C> __device__ __forceinline__ C neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() { return -__longlong_as_double(0x7ff0000000000000ll); }
template <typename C> __device__ __forceinline__ C quiet_nan() { return neg_inf<C>() - neg_inf<C>(); }
template <typename C> __device__ __forceinline__ bool is_finite(C v) { return v - v == (C)0; }

template <typename C> __device__ __forceinline__ C warp_sum(C v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
}

template <typename T>
__device__ void cross_entropy_impl(const T* x, u64 n, u64 c, i64 rs, i64 cs, const i64* t, i64 ts,
                                   double smoothing, double grad_scale, T* loss, T* grad, float* correct,
                                   float* loss_sum, float* finite, float* hits, u32* flag) {
    typedef typename Compute<T>::type C;
    const u64 lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const C e = (C)smoothing, uniform = (C)(smoothing / (double)c), scale = (C)grad_scale;
    const C on_label = (C)1 - e + uniform;
    for (u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < n; row += warps) {
        const T* xr = x + (i64)row * rs;
        // Pass 1: the first maximum.
        C m = neg_inf<C>();
        i64 am = 0x7fffffffffffffffll;
        for (u64 j = lane; j < c; j += 32) {
            C v = to_c(xr[(i64)j * cs]);
            if (v > m || (v != v && m == m)) { m = v; am = (i64)j; }
        }
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) {
            C om = shfl_xor(m, s);
            i64 oa = shfl_xor(am, s);
            bool take = (om > m) || (om != om && m == m) || ((om == m || (om != om && m != m)) && oa < am);
            if (take) { m = om; am = oa; }
        }
        // Pass 2: the normaliser and the row sum (for smoothing).
        const C shift = is_finite(m) ? m : (C)0;
        C sum = 0, sum_x = 0;
        for (u64 j = lane; j < c; j += 32) {
            C v = to_c(xr[(i64)j * cs]);
            sum += k_exp(v - shift);
            sum_x += v;
        }
        sum = warp_sum(sum);
        sum_x = warp_sum(sum_x);
        const i64 label = t[(i64)row * ts];
        const bool ok = label >= 0 && (u64)label < c;
        if (!ok && lane == 0) raise_flag(flag, 2);
        const C inv = (C)1 / sum;
        // Pass 3: the gradient.
        T* gr = grad + row * c;
        for (u64 j = lane; j < c; j += 32) {
            C p = k_exp(to_c(xr[(i64)j * cs]) - shift) * inv;
            C q = (i64)j == label ? on_label : uniform;
            gr[j] = from_c<T>(ok ? (p - q) * scale : quiet_nan<C>());
        }
        if (lane == 0) {
            C target = ok ? to_c(xr[label * cs]) : quiet_nan<C>();
            const T row_loss = from_c<T>((shift + k_log(sum) - ((C)1 - e) * target - uniform * sum_x) * scale);
            const float hit = am == label ? 1.0f : 0.0f;
            loss[row] = row_loss;
            correct[row] = hit;
            // An epoch's running sums (f32), as the separate ops would update them:
            // loss_sum += loss; finite += isfinite(loss_sum); hits += hit.
            if (loss_sum) {
                const float s = loss_sum[row] + (float)to_c(row_loss);
                loss_sum[row] = s;
                finite[row] += isfinite(s) ? 1.0f : 0.0f;
                hits[row] += hit;
            }
        }
    }
}

#define CROSS_ENTROPY_FOR(T, NAME)                                                                           \
    extern "C" __global__ void cross_entropy_##NAME(const T* x, u64 n, u64 c, i64 rs, i64 cs, const i64* t,  \
                                                    i64 ts, double smoothing, double grad_scale, T* loss,    \
                                                    T* grad, float* correct, float* loss_sum, float* finite, \
                                                    float* hits, u32* flag) {                                \
        cross_entropy_impl<T>(x, n, c, rs, cs, t, ts, smoothing, grad_scale, loss, grad, correct, loss_sum,  \
                              finite, hits, flag);                                                          \
    }
CROSS_ENTROPY_FOR(f16, f16)
CROSS_ENTROPY_FOR(bf16, bf16)
CROSS_ENTROPY_FOR(float, f32)
CROSS_ENTROPY_FOR(double, f64)
