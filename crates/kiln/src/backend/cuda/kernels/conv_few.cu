// Convolutions with few output channels (1–3) and many taps per output channel: stride 1,
// dilation 1, one group, a square kernel of 3, 5 or 7. The input gradient of an image
// network's first layer is one: for b256 1→32 5×5 it is a 32→1 convolution of the output
// gradient, 800 taps per pixel, where cuDNN's kernels took 0.06–0.09 ms on an H200 and kiln's
// tensor-core kernel computes 32 output channels to keep one.
//
// A block computes a tile of one image's output, FEW_RY·rgy rows by 4·cgx columns, for every
// output channel. Its threads are `split` groups of cgx·rgy threads; each thread owns a patch
// of FEW_RY rows × 4 columns. The input channels pass through shared memory `ck` at a time
// (rows with their halo as f32, or f64 for f64, zero outside the image; then the chunk's
// weights), and group s takes the chunk's channels s, s + split, ... . A thread loads each
// input row under its patch once (4 + K − 1 values, in 16-byte loads) and applies it to every
// kernel row that reaches one of its output rows: FEW_RY + K − 1 row loads per channel for
// FEW_RY·4·K·K multiply-adds per output channel. At the end the groups' sums are added in a
// fixed order (deterministic), the bias added and the ReLU applied where asked.
//
// x is read through its strides (Win: g.c input channels, g.h × g.w, output g.oh × g.ow,
// padding g.ph/g.pw); w is packed [c_out, c, K, K], or with `flip` the packed
// [c, c_out, K, K] filter of the forward convolution whose input gradient this is (transposed
// and mirrored here); y is packed [n, c_out, oh, ow]. The grid is n · tiles_y · tiles_x
// blocks of at most 256 threads; the dynamic shared memory holds the larger of the chunk
// (ck·rows·pitch + ck·ws values, rows = FEW_RY·rgy + K − 1, ws = K·K·CO rounded up to 4) and
// the groups' partial sums ((split − 1)·FEW_RY·4·CO values per thread of a group).
#define FEW_RY 4
// Channels of a row a warp's staging loads have in flight.
#ifndef FEW_BATCH
#define FEW_BATCH 8
#endif

template <typename C> struct __align__(4 * sizeof(C)) FewQuad { C v[4]; };

template <typename T, int K, int CO>
__device__ void conv_few_impl(const T* x, const T* w, T* y, Win g, int c_out, int flip, const T* bias,
                              int relu, int cgx, int rgy, int split, int ck, int pitch) {
    typedef typename Compute<T>::type C;
    // Window loads: 4 + K − 1 values rounded up to whole quads.
    constexpr int NQ = (K + 6) / 4;
    constexpr int KK = K * K;
    // A channel's weights, [tap][output channel], padded to whole quads; held in registers
    // while the channel is walked where they fit (up to 100 32-bit registers), else read from
    // shared memory at each use.
    constexpr int WS = (KK * CO + 3) / 4 * 4;
    constexpr bool HOLD = WS * sizeof(C) <= 400;
    extern __shared__ __align__(32) unsigned char few_smem[];
    C* xs = reinterpret_cast<C*>(few_smem);
    const int rows = FEW_RY * rgy + K - 1;
    C* ws = xs + ck * rows * pitch;
    const int group = cgx * rgy;
    const int s = threadIdx.x / group, p = threadIdx.x - s * group;
    const int rg = p / cgx, cg = p - rg * cgx;
    const int OH = (int)g.oh, OW = (int)g.ow, H = (int)g.h, W = (int)g.w, CIN = (int)g.c;
    const int tiles_x = (OW + 4 * cgx - 1) / (4 * cgx), tiles_y = (OH + FEW_RY * rgy - 1) / (FEW_RY * rgy);
    const int tx = (int)(blockIdx.x % (u32)tiles_x), rest = (int)(blockIdx.x / (u32)tiles_x);
    const int ty = rest % tiles_y, b = rest / tiles_y;
    const int ox0 = tx * 4 * cgx, oy0 = ty * FEW_RY * rgy;
    const int ix0 = ox0 - (int)g.pw, iy0 = oy0 - (int)g.ph;
    const T* xb = x + g.offset + (u64)b * g.s[0];
    // Staging: a warp (or the whole block, if smaller) per row, its lanes along the row.
    const int lanes = min(32, (int)blockDim.x), warps = (int)blockDim.x / lanes;
    const int warp = threadIdx.x / lanes, lane = threadIdx.x % lanes;

    C acc[CO][FEW_RY][4];
#pragma unroll
    for (int co = 0; co < CO; ++co)
#pragma unroll
        for (int r = 0; r < FEW_RY; ++r)
#pragma unroll
            for (int px = 0; px < 4; ++px) acc[co][r][px] = 0;

    for (int c0 = 0; c0 < CIN; c0 += ck) {
        __syncthreads();  // the previous chunk is no longer read
        // A warp takes rows warp, warp + warps, ... of every channel of the chunk, its lanes
        // along the row; the loads of FEW_BATCH channels are all issued before any is
        // stored, so their latencies overlap.
        for (int r = warp < warps ? warp : rows; r < rows; r += warps) {
            const int iy = iy0 + r;
            const bool row_in = iy >= 0 && iy < H;
            for (int sc = lane; sc < pitch; sc += lanes) {
                const int ix = ix0 + sc;
                const bool in = row_in && ix >= 0 && ix < W;
                const T* src = xb + (u64)c0 * g.s[1] + (u64)(in ? iy : 0) * g.s[2] + (u64)(in ? ix : 0) * g.s[3];
                C* dst = xs + r * pitch + sc;
                for (int cb = 0; cb < ck; cb += FEW_BATCH) {
                    C v[FEW_BATCH];
#pragma unroll
                    for (int j = 0; j < FEW_BATCH; ++j) {
                        const int c = cb + j;
                        v[j] = in && c < ck && c0 + c < CIN ? to_c(src[(u64)c * g.s[1]]) : (C)0;
                    }
#pragma unroll
                    for (int j = 0; j < FEW_BATCH; ++j)
                        if (cb + j < ck) dst[(cb + j) * rows * pitch] = v[j];
                }
            }
        }
        for (int i = threadIdx.x; i < ck * WS; i += blockDim.x) {
            const int c = i / WS, tap = (i % WS) / CO, co = (i % WS) % CO;
            const int ci = c0 + c;
            C v = 0;
            if (ci < CIN && tap < KK && co < c_out) {
                const int ky = tap / K, kx = tap % K;
                const u64 at = flip ? ((u64)ci * c_out + co) * KK + (K - 1 - ky) * K + (K - 1 - kx)
                                    : ((u64)co * CIN + ci) * KK + tap;
                v = to_c(w[at]);
            }
            ws[i] = v;
        }
        __syncthreads();
        const int count = min(ck, CIN - c0);
        for (int c = s; c < count; c += split) {
            const C* xr = xs + (c * rows + FEW_RY * rg) * pitch + 4 * cg;
            const C* wc = ws + c * WS;
            C wr[HOLD ? WS : 1];
            if constexpr (HOLD) {
#pragma unroll
                for (int q = 0; q < WS / 4; ++q) {
                    const FewQuad<C> w4 = reinterpret_cast<const FewQuad<C>*>(wc)[q];
#pragma unroll
                    for (int k = 0; k < 4; ++k) wr[4 * q + k] = w4.v[k];
                }
            }
#pragma unroll
            for (int r = 0; r < FEW_RY + K - 1; ++r) {
                C v[4 * NQ];
#pragma unroll
                for (int q = 0; q < NQ; ++q) {
                    const FewQuad<C> v4 = reinterpret_cast<const FewQuad<C>*>(xr + r * pitch)[q];
#pragma unroll
                    for (int k = 0; k < 4; ++k) v[4 * q + k] = v4.v[k];
                }
#pragma unroll
                for (int ky = 0; ky < K; ++ky) {
                    const int oy = r - ky;
                    if (oy < 0 || oy >= FEW_RY) continue;
#pragma unroll
                    for (int kx = 0; kx < K; ++kx)
#pragma unroll
                        for (int co = 0; co < CO; ++co) {
                            const int at = (ky * K + kx) * CO + co;
                            const C wv = HOLD ? wr[HOLD ? at : 0] : wc[at];
#pragma unroll
                            for (int px = 0; px < 4; ++px) acc[co][oy][px] += v[px + kx] * wv;
                        }
                }
            }
        }
    }

    // The groups' sums, added by group 0 in the order of the groups.
    constexpr int NACC = CO * FEW_RY * 4;
    if (split > 1) {
        __syncthreads();
        C* red = xs;
        if (s > 0) {
#pragma unroll
            for (int co = 0; co < CO; ++co)
#pragma unroll
                for (int r = 0; r < FEW_RY; ++r)
#pragma unroll
                    for (int px = 0; px < 4; ++px)
                        red[((s - 1) * NACC + (co * FEW_RY + r) * 4 + px) * group + p] = acc[co][r][px];
        }
        __syncthreads();
        if (s > 0) return;
        for (int o = 1; o < split; ++o)
#pragma unroll
            for (int co = 0; co < CO; ++co)
#pragma unroll
                for (int r = 0; r < FEW_RY; ++r)
#pragma unroll
                    for (int px = 0; px < 4; ++px)
                        acc[co][r][px] += red[((o - 1) * NACC + (co * FEW_RY + r) * 4 + px) * group + p];
    }
    const int oy = oy0 + FEW_RY * rg, ox = ox0 + 4 * cg;
#pragma unroll
    for (int co = 0; co < CO; ++co) {
        if (co >= c_out) break;
        const C add = bias ? to_c(bias[co]) : (C)0;
        T* yp = y + (((u64)b * c_out + co) * OH + oy) * OW + ox;
#pragma unroll
        for (int r = 0; r < FEW_RY; ++r) {
            if (oy + r >= OH) break;
#pragma unroll
            for (int px = 0; px < 4; ++px) {
                if (ox + px >= OW) break;
                C v = acc[co][r][px] + add;
                if (relu) v = v <= (C)0 ? (C)0 : v;  // NaN passes, as in add_relu
                yp[(u64)r * OW + px] = from_c<T>(v);
            }
        }
    }
}

#define CONV_FEW_KERNEL(T, NAME, K, CO)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) conv_few##K##x##CO##_##NAME(const T* x, const T* w, T* y, Win g, int c_out,   \
                                                           int flip, const T* bias, int relu, int cgx,       \
                                                           int rgy, int split, int ck, int pitch) {          \
        conv_few_impl<T, K, CO>(x, w, y, g, c_out, flip, bias, relu, cgx, rgy, split, ck, pitch);           \
    }
#define CONV_FEW_FOR(T, NAME)  \
    CONV_FEW_KERNEL(T, NAME, 3, 1) \
    CONV_FEW_KERNEL(T, NAME, 3, 3) \
    CONV_FEW_KERNEL(T, NAME, 5, 1) \
    CONV_FEW_KERNEL(T, NAME, 5, 3) \
    CONV_FEW_KERNEL(T, NAME, 7, 1) \
    CONV_FEW_KERNEL(T, NAME, 7, 3)

CONV_FEW_FOR(f16, f16)
CONV_FEW_FOR(bf16, bf16)
CONV_FEW_FOR(float, f32)
CONV_FEW_FOR(double, f64)
