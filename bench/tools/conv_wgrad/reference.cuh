// The weight gradient's f64 reference for the standalone harness (bench.cu):
// ref[co][ci][kh][kw] = Σ over (image, oh, ow) of x · dy in f64, and mag the same sum of
// |x · dy| (the scale an error is measured against), for packed NCHW x and dy of any float T.
template <typename T>
__global__ void wgrad_reference(const T* x, const T* dy, double* ref, double* mag, Win g, int K) {
    const u64 total = (u64)K * g.c * g.kh * g.kw;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const int kw = e % g.kw, kh = (e / g.kw) % g.kh, ci = (e / (g.kw * g.kh)) % g.c, co = e / (g.kw * g.kh * g.c);
        double s = 0, m = 0;
        for (u64 n = 0; n < g.n; ++n)
            for (int oh = 0; oh < (int)g.oh; ++oh) {
                const int ih = oh * g.sh - g.ph + kh * g.dh;
                if (ih < 0 || ih >= (int)g.h) continue;
                for (int ow = 0; ow < (int)g.ow; ++ow) {
                    const int iw = ow * g.sw - g.pw + kw * g.dw;
                    if (iw < 0 || iw >= (int)g.w) continue;
                    const double p = (double)to_c(x[((n * g.c + ci) * g.h + ih) * g.w + iw]) *
                                     (double)to_c(dy[((n * K + co) * g.oh + oh) * g.ow + ow]);
                    s += p;
                    m += fabs(p);
                }
            }
        ref[e] = s;
        mag[e] = m;
    }
}

// The bias gradient's f64 reference: ref[co] = Σ dy over (image, oh, ow), mag the same sum of
// |dy|, one block of 128 threads a channel.
template <typename T>
__global__ void bias_reference(const T* dy, double* ref, double* mag, Win g, int K) {
    __shared__ double s_sum[128], s_mag[128];
    const int co = blockIdx.x;
    const u64 plane = g.oh * g.ow;
    double s = 0, m = 0;
    for (u64 n = 0; n < g.n; ++n)
        for (u64 p = threadIdx.x; p < plane; p += blockDim.x) {
            const double v = (double)to_c(dy[(n * K + co) * plane + p]);
            s += v;
            m += fabs(v);
        }
    s_sum[threadIdx.x] = s;
    s_mag[threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int t = 1; t < (int)blockDim.x; ++t) s += s_sum[t], m += s_mag[t];
        ref[co] = s;
        mag[co] = m;
    }
}
