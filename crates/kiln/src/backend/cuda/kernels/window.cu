// Sliding-window kernels over NCHW tensors: im2col (unfold) and its adjoint (fold) for
// convolutions, max/avg pooling and its gradient. Every kernel writes each output element
// from one thread (gradients are gathered, not scattered), so results are deterministic.
// `Win` and `GRID_LOOP` come from window.cuh.

// col[(ch, i, j), (b, y, x)] = x[b, ch, y·sh − ph + i·dh, x·sw − pw + j·dw], 0 outside.
template <typename T> __device__ void unfold_impl(const T* x, T* col, Win g) {
    u64 np = g.n * g.oh * g.ow, total = np * g.c * (u64)(g.kh * g.kw);
    GRID_LOOP(t, total) {
        u64 r = t / np, q = t - r * np;
        i64 j = (i64)(r % (u64)g.kw);
        u64 r2 = r / (u64)g.kw;
        i64 i = (i64)(r2 % (u64)g.kh);
        u64 ch = r2 / (u64)g.kh;
        u64 xo = q % g.ow, q2 = q / g.ow;
        u64 yo = q2 % g.oh, b = q2 / g.oh;
        i64 iy = (i64)yo * g.sh - g.ph + i * g.dh;
        i64 ix = (i64)xo * g.sw - g.pw + j * g.dw;
        T v = from_c<T>(0);
        if (iy >= 0 && iy < (i64)g.h && ix >= 0 && ix < (i64)g.w)
            v = x[g.offset + b * g.s[0] + ch * g.s[1] + (u64)iy * g.s[2] + (u64)ix * g.s[3]];
        col[t] = v;
    }
}

// x[b, ch, iy, ix] = Σ over taps (i, j) landing on it of col[(ch, i, j), (b, y, x)].
template <typename T> __device__ void fold_impl(const T* col, T* x, Win g) {
    typedef typename Compute<T>::type C;
    u64 total = g.n * g.c * g.h * g.w;
    GRID_LOOP(t, total) {
        i64 ix = (i64)(t % g.w);
        u64 t2 = t / g.w;
        i64 iy = (i64)(t2 % g.h);
        u64 t3 = t2 / g.h;
        u64 ch = t3 % g.c, b = t3 / g.c;
        C acc = 0;
        for (i64 i = 0; i < g.kh; ++i) {
            i64 ny = iy + g.ph - i * g.dh;
            if (ny < 0 || ny % g.sh != 0) continue;
            i64 yo = ny / g.sh;
            if (yo >= (i64)g.oh) continue;
            for (i64 j = 0; j < g.kw; ++j) {
                i64 nx = ix + g.pw - j * g.dw;
                if (nx < 0 || nx % g.sw != 0) continue;
                i64 xo = nx / g.sw;
                if (xo >= (i64)g.ow) continue;
                u64 row = (ch * (u64)g.kh + (u64)i) * (u64)g.kw + (u64)j;
                u64 colj = (b * g.oh + (u64)yo) * g.ow + (u64)xo;
                acc += to_c(col[g.offset + row * g.s[0] + colj * g.s[1]]);
            }
        }
        x[t] = from_c<T>(acc);
    }
}

// One thread per output: the window's max (NaN wins, first on ties) and its plane position,
// or its zero-padded mean. `I` is u32 when every index fits (cheap divisions), else u64.
template <typename T, typename I> __device__ void pool_at(const T* x, T* y, u32* ids, const Win& g, int is_max) {
    typedef typename Compute<T>::type C;
    const I OW = (I)g.ow, OH = (I)g.oh, CH = (I)g.c, total = (I)(g.n * g.c * g.oh * g.ow);
    const int H = (int)g.h, W = (int)g.w, KH = (int)g.kh, KW = (int)g.kw;
    GRID_LOOP(t64, total) {
        const I t = (I)t64;
        const I t2 = t / OW, t3 = t2 / OH;
        const int xo = (int)(t - t2 * OW), yo = (int)(t2 - t3 * OH);
        const I b = t3 / CH, ch = t3 - b * CH;
        const T* plane = x + g.offset + (u64)b * g.s[0] + (u64)ch * g.s[1];
        C best = 0, sum = 0;
        u32 at = 0xffffffffu;
        for (int i = 0; i < KH; ++i) {
            const int iy = yo * (int)g.sh - (int)g.ph + i;
            if (iy < 0 || iy >= H) continue;
            for (int j = 0; j < KW; ++j) {
                const int ix = xo * (int)g.sw - (int)g.pw + j;
                if (ix < 0 || ix >= W) continue;
                C v = to_c(plane[(u64)iy * g.s[2] + (u64)ix * g.s[3]]);
                sum += v;
                if (at == 0xffffffffu || v > best || (v != v && best == best)) {
                    best = v;
                    at = (u32)iy * (u32)W + (u32)ix;
                }
            }
        }
        if (is_max) {
            y[t] = from_c<T>(best);
            ids[t] = at;
        } else {
            y[t] = from_c<T>(sum / (C)(g.kh * g.kw));
        }
    }
}

// `pool_at` for windows that tile the input (kernel = stride, no padding or dilation: the
// host's `windows_tile_input`): no bounds tests, and the window's rows addressed from one
// base, with the same scan order (row-major, first maximum kept, NaN wins).
template <typename T, typename I> __device__ void pool_tiled_at(const T* x, T* y, u32* ids, const Win& g, int is_max) {
    typedef typename Compute<T>::type C;
    const I OW = (I)g.ow, OHW = (I)(g.oh * g.ow), CH = (I)g.c, total = (I)(g.n * g.c) * OHW;
    const int W = (int)g.w, KH = (int)g.kh, KW = (int)g.kw;
    const u64 sy = g.s[2], sx = g.s[3];
    GRID_LOOP(t64, total) {
        const I t = (I)t64;
        const I bc = t / OHW, o = t - bc * OHW;
        const I yo = o / OW, xo = o - yo * OW;
        const I b = bc / CH, ch = bc - b * CH;
        const u32 iy0 = (u32)yo * (u32)KH, ix0 = (u32)xo * (u32)KW;
        const T* win = x + g.offset + (u64)b * g.s[0] + (u64)ch * g.s[1] + (u64)iy0 * sy + (u64)ix0 * sx;
        C best = 0, sum = 0;
        u32 at = 0xffffffffu;
        for (int i = 0; i < KH; ++i) {
            for (int j = 0; j < KW; ++j) {
                C v = to_c(win[(u64)i * sy + (u64)j * sx]);
                sum += v;
                if (at == 0xffffffffu || v > best || (v != v && best == best)) {
                    best = v;
                    at = (iy0 + (u32)i) * (u32)W + ix0 + (u32)j;
                }
            }
        }
        if (is_max) {
            y[t] = from_c<T>(best);
            ids[t] = at;
        } else {
            y[t] = from_c<T>(sum / (C)(g.kh * g.kw));
        }
    }
}

template <typename T> __device__ void pool_impl(const T* x, T* y, u32* ids, Win g, int is_max) {
    if (g.n * g.c * g.oh * g.ow <= 0xffffffffull) pool_at<T, u32>(x, y, ids, g, is_max);
    else pool_at<T, u64>(x, y, ids, g, is_max);
}

template <typename T> __device__ void pool_tiled_impl(const T* x, T* y, u32* ids, Win g, int is_max) {
    if (g.n * g.c * g.oh * g.ow <= 0xffffffffull) pool_tiled_at<T, u32>(x, y, ids, g, is_max);
    else pool_tiled_at<T, u64>(x, y, ids, g, is_max);
}

// dx[b, ch, iy, ix]: the gradients of the outputs whose window covers the element (for
// max-pooling, only those whose maximum it was). `g.s` are the output gradient's strides.
// Plane sizes and the window fit in int (checked by the host), so the window arithmetic is
// 32-bit; `I` as in `pool_at`.
template <typename T, typename I>
__device__ void pool_backward_at(const T* gy, const u32* ids, T* dx, const Win& g, int is_max) {
    typedef typename Compute<T>::type C;
    const I HW = (I)(g.h * g.w), CH = (I)g.c, total = (I)(g.n * g.c * g.h * g.w);
    const int W = (int)g.w, OH = (int)g.oh, OW = (int)g.ow, KH = (int)g.kh, KW = (int)g.kw;
    const int SH = (int)g.sh, SW = (int)g.sw, PH = (int)g.ph, PW = (int)g.pw;
    const C inv_area = (C)1 / (C)(g.kh * g.kw);
    GRID_LOOP(t64, total) {
        const I t = (I)t64;
        const I bc = t / HW, pos = t - bc * HW;
        const int iy = (int)pos / W, ix = (int)pos - iy * W;
        const I b = bc / CH, ch = bc - b * CH;
        // Outputs y with y·sh − ph ≤ iy ≤ y·sh − ph + kh − 1.
        int y_lo = iy + PH - KH + 1, y_hi = iy + PH;
        y_lo = y_lo <= 0 ? 0 : (y_lo + SH - 1) / SH;
        y_hi = y_hi < 0 ? -1 : y_hi / SH;
        if (y_hi >= OH) y_hi = OH - 1;
        int x_lo = ix + PW - KW + 1, x_hi = ix + PW;
        x_lo = x_lo <= 0 ? 0 : (x_lo + SW - 1) / SW;
        x_hi = x_hi < 0 ? -1 : x_hi / SW;
        if (x_hi >= OW) x_hi = OW - 1;
        const T* gp = gy + g.offset + (u64)b * g.s[0] + (u64)ch * g.s[1];
        const u32* ip = ids + (u64)bc * (u64)OH * (u64)OW;
        C acc = 0;
        for (int yo = y_lo; yo <= y_hi; ++yo) {
            for (int xo = x_lo; xo <= x_hi; ++xo) {
                C v = to_c(gp[(u64)yo * g.s[2] + (u64)xo * g.s[3]]);
                if (is_max) {
                    if (ip[yo * OW + xo] == (u32)pos) acc += v;
                } else {
                    acc += v * inv_area;
                }
            }
        }
        dx[t] = from_c<T>(acc);
    }
}

template <typename T>
__device__ void pool_backward_impl(const T* gy, const u32* ids, T* dx, Win g, int is_max) {
    if (g.n * g.c * g.h * g.w <= 0xffffffffull) pool_backward_at<T, u32>(gy, ids, dx, g, is_max);
    else pool_backward_at<T, u64>(gy, ids, dx, g, is_max);
}

// Pooling whose windows tile the input exactly (kernel = stride, no padding or dilation, the
// input a whole number of windows, as in the usual 2×2/2 max-pool): one thread per output
// element writes its whole window of dx — the gradient at the max's position (or spread evenly
// for the average) and 0 elsewhere — instead of one thread per input element finding the
// windows that cover it (seven integer divisions each; that version ran at about a quarter
// of the copy rate on the CNN's pools).
template <typename T, typename I>
__device__ void pool_backward_tiled_at(const T* gy, const u32* ids, T* dx, const Win& g, int is_max) {
    typedef typename Compute<T>::type C;
    const I OW = (I)g.ow, OHW = (I)(g.oh * g.ow), CH = (I)g.c, W = (I)g.w;
    const I total = (I)(g.n * g.c) * OHW;
    const u64 HW = g.h * g.w;
    const int KH = (int)g.kh, KW = (int)g.kw;
    const C inv_area = (C)1 / (C)(g.kh * g.kw);
    GRID_LOOP(t64, total) {
        const I t = (I)t64;
        const I bc = t / OHW, o = t - bc * OHW;
        const I yo = o / OW, xo = o - yo * OW;
        const I b = bc / CH, ch = bc - b * CH;
        const C v = to_c(gy[g.offset + (u64)b * g.s[0] + (u64)ch * g.s[1] + (u64)yo * g.s[2] + (u64)xo * g.s[3]]);
        const u32 at = is_max ? ids[t] : 0xffffffffu;
        T* d = dx + (u64)bc * HW;
        const u32 y0 = (u32)yo * (u32)KH, x0 = (u32)xo * (u32)KW;
        for (int i = 0; i < KH; ++i) {
            const u32 row = (y0 + (u32)i) * (u32)W + x0;
            for (int j = 0; j < KW; ++j) {
                const u32 p = row + (u32)j;
                d[p] = from_c<T>(is_max ? (p == at ? v : (C)0) : v * inv_area);
            }
        }
    }
}

template <typename T>
__device__ void pool_backward_tiled_impl(const T* gy, const u32* ids, T* dx, Win g, int is_max) {
    if (g.n * g.c * g.oh * g.ow <= 0xffffffffull) pool_backward_tiled_at<T, u32>(gy, ids, dx, g, is_max);
    else pool_backward_tiled_at<T, u64>(gy, ids, dx, g, is_max);
}

// y = act(y + bias[channel]) in place over a packed NCHW output of `total` elements with
// planes of `hw` (the bias and ReLU of a convolution that cuDNN or im2col computed): one pass
// with 16-byte accesses, where a broadcast add_relu (strided indexing, a division per
// dimension and element) ran at about a quarter of the copy rate.
template <typename T>
__device__ void conv_bias_act_impl(T* y, const T* bias, u64 total, u64 c_out, u64 hw, u64 b_stride, int relu) {
    typedef typename Compute<T>::type C;
    const u64 V = 16 / sizeof(T);
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)blockDim.x * gridDim.x;
    const bool narrow = total <= 0xffffffffull;
    auto channel = [&](u64 i) -> u64 {
        if (narrow) return (u64)(((u32)i / (u32)hw) % (u32)c_out);
        return (i / hw) % c_out;
    };
    auto act = [&](C v) -> C { return relu && v <= (C)0 ? (C)0 : v; };  // NaN passes, as in add_relu
    if (hw % V == 0 && ((u64)y & 15) == 0) {
        // A pack never straddles two planes: one bias value per pack.
        Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
        for (u64 p = tid; p < total / V; p += stride) {
            const C b = to_c(bias[channel(p * V) * b_stride]);
            Pack<T> pk = yp[p];
#pragma unroll
            for (int k = 0; k < (int)V; ++k) pk.v[k] = from_c<T>(act(to_c(pk.v[k]) + b));
            yp[p] = pk;
        }
    } else {
        for (u64 i = tid; i < total; i += stride)
            y[i] = from_c<T>(act(to_c(y[i]) + to_c(bias[channel(i) * b_stride])));
    }
}

// Direct convolution for few taps per output channel (c·kh·kw ≤ DIRECT_TAPS, one group), where
// cuDNN's implicit GEMMs leave most of the GPU idle (b256 1→32 5×5: 3–5 TFLOP/s). Forward: one
// thread per output pixel (b, yo, xo) computing CO output channels (blockIdx.y picks which:
// DIRECT_CO, or twice that in the `wide` kernel, which spends the per-tap work of addressing
// and loading x on twice the multiply-adds: the kernel was issue-bound, 80% of issue slots
// used), the filter slice in shared memory as [tap][channel]; x is read through its strides,
// w is packed [c_out, c·kh·kw], y is packed NCHW. A non-null `bias` is added and `relu`
// applied before the store (the fused conv2d_bias_act).
#define DIRECT_CO 16
template <typename C> struct __align__(4 * sizeof(C)) Quad { C v[4]; };
#define DIRECT_TAPS 64
template <typename T, int CO>
__device__ void conv_direct_impl(const T* x, const T* w, T* y, Win g, u64 c_out, const T* bias, int relu) {
    typedef typename Compute<T>::type C;
    // The filter slice as quads of channels: a tap's CO weights are CO/4 16-byte (f64: 32-byte)
    // shared loads instead of CO.
    __shared__ Quad<C> wq[DIRECT_TAPS * CO / 4];
    C* wsh = reinterpret_cast<C*>(wq);
    const u64 co0 = (u64)blockIdx.y * CO;
    const int taps = (int)(g.c * (u64)(g.kh * g.kw));
    for (int i = threadIdx.x; i < taps * CO; i += blockDim.x) {
        int r = i / CO, k = i - r * CO;
        wsh[i] = co0 + k < c_out ? to_c(w[(co0 + k) * taps + r]) : (C)0;
    }
    __syncthreads();
    const int H = (int)g.h, W = (int)g.w, KH = (int)g.kh, KW = (int)g.kw;
    const int SH = (int)g.sh, SW = (int)g.sw, PH = (int)g.ph, PW = (int)g.pw, DH = (int)g.dh, DW = (int)g.dw;
    const u64 plane = g.oh * g.ow, np = g.n * plane;
    const bool narrow = np <= 0xffffffffull;
    GRID_LOOP(t, np) {
        // 32-bit divisions where the index fits (nearly always): 64-bit ones cost ~4x more.
        u64 b, pix;
        if (narrow) {
            const u32 t32 = (u32)t, b32 = t32 / (u32)plane;
            b = b32;
            pix = t32 - b32 * (u32)plane;
        } else {
            b = t / plane;
            pix = t - b * plane;
        }
        const int yo = (int)((u32)pix / (u32)g.ow), xo = (int)((u32)pix - (u32)yo * (u32)g.ow);
        C acc[CO];
#pragma unroll
        for (int k = 0; k < CO; ++k) acc[k] = 0;
        const T* xb = x + g.offset + b * g.s[0];
        const Quad<C>* wr = wq;
        for (u64 ch = 0; ch < g.c; ++ch) {
            const T* xc = xb + ch * g.s[1];
            for (int i = 0; i < KH; ++i) {
                const int iy = yo * SH - PH + i * DH;
                const bool row_in = iy >= 0 && iy < H;
                for (int j = 0; j < KW; ++j, wr += CO / 4) {
                    const int ix = xo * SW - PW + j * DW;
                    const C v = row_in && ix >= 0 && ix < W ? to_c(xc[(u64)iy * g.s[2] + (u64)ix * g.s[3]]) : (C)0;
#pragma unroll
                    for (int q = 0; q < CO / 4; ++q) {
                        const Quad<C> w4 = wr[q];
#pragma unroll
                        for (int k = 0; k < 4; ++k) acc[4 * q + k] += v * w4.v[k];
                    }
                }
            }
        }
        T* yp = y + (b * c_out + co0) * plane + pix;
#pragma unroll
        for (int k = 0; k < CO; ++k) {
            if (co0 + k >= c_out) continue;
            C v = acc[k];
            if (bias) v += to_c(bias[co0 + k]);
            if (relu) v = v <= (C)0 ? (C)0 : v;  // NaN passes, as in add_relu
            yp[(u64)k * plane] = from_c<T>(v);
        }
    }
}

// Weight gradient of the direct convolution, a GEMM with a long reduction:
// partial[blockIdx.x, co, r] = Σ over the block's `chunk` pixels p of dy[co, p] · x_r(p)
// (x_r: tap r's input under pixel p, 0 in the padding). Each step stages WGRAD_P pixels of
// the im2col rows (all taps) and of dy (WGRAD_CO channels) in shared memory; a thread owns a
// 4-channel × 4-tap tile and G groups of threads split the staged pixels four at a time, so
// one step costs eight 16-byte loads per 64 multiply-adds. The groups' tiles are added in a
// fixed order at the end and `conv_direct_wgrad_sum` adds the blocks' partials (stored
// [c_out·taps][blocks]) in a fixed order (deterministic). dy is packed NCHW.
#define WGRAD_P 32
#define WGRAD_CO 32
#define WGRAD_STRIDE (WGRAD_P + 4)
#define WGRAD_RAW_BYTES 32768

__device__ __forceinline__ void load4(const float* p, float (&o)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}
__device__ __forceinline__ void load4(const double* p, double (&o)[4]) {
    const double2 a = *reinterpret_cast<const double2*>(p), b = *reinterpret_cast<const double2*>(p + 2);
    o[0] = a.x; o[1] = a.y; o[2] = b.x; o[3] = b.y;
}

template <typename T> __device__ void conv_direct_wgrad_impl(const T* x, const T* dy,
                                                             typename Compute<T>::type* partial, Win g,
                                                             u64 c_out, u64 chunk) {
    typedef typename Compute<T>::type C;
    // Staging ([64 taps][P] of x, [32 channels][P] of dy) and, after the loop, the groups'
    // tiles (at most 256 threads × 16 sums) share one buffer.
    __shared__ __align__(16) unsigned char raw[WGRAD_RAW_BYTES];
    C* xs = reinterpret_cast<C*>(raw);
    C* ds = xs + DIRECT_TAPS * WGRAD_STRIDE;
    __shared__ int tap_ch[DIRECT_TAPS], tap_y[DIRECT_TAPS], tap_x[DIRECT_TAPS];
    __shared__ u64 px_x[WGRAD_P], px_dy[WGRAD_P];
    __shared__ int px_iy[WGRAD_P], px_ix[WGRAD_P];
    const int KW = (int)g.kw, khw = (int)(g.kh * g.kw), taps = (int)(g.c * (u64)khw);
    const int H = (int)g.h, W = (int)g.w;
    const int quads = (taps + 3) / 4, tiles = (WGRAD_CO / 4) * quads;
    int groups = (int)blockDim.x / tiles;
    if (groups > 8) groups = 8;
    const int tid = threadIdx.x, tile = tid % tiles, grp = tid / tiles;
    const bool active = grp < groups;
    const int cq = tile % (WGRAD_CO / 4), rq = tile / (WGRAD_CO / 4);
    for (int r = tid; r < taps; r += blockDim.x) {
        const int ch = r / khw, rem = r - ch * khw, ki = rem / KW, kj = rem - ki * KW;
        tap_ch[r] = ch;
        tap_y[r] = ki * (int)g.dh;
        tap_x[r] = kj * (int)g.dw;
    }
    const u64 co0 = (u64)blockIdx.y * WGRAD_CO;
    const u64 plane = g.oh * g.ow, np = g.n * plane;
    const u64 p_begin = (u64)blockIdx.x * chunk;
    const u64 p_end = p_begin + chunk < np ? p_begin + chunk : np;
    C acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0;
    for (u64 p0 = p_begin; p0 < p_end; p0 += WGRAD_P) {
        __syncthreads();  // the previous step's reads are done (and the tap table is written)
        if (tid < WGRAD_P) {
            const u64 p = p0 + tid;
            if (p < p_end) {
                const u64 b = p / plane, pix = p - b * plane;
                const int yo = (int)(pix / g.ow), xo = (int)(pix - (u64)yo * g.ow);
                px_iy[tid] = yo * (int)g.sh - (int)g.ph;
                px_ix[tid] = xo * (int)g.sw - (int)g.pw;
                px_x[tid] = g.offset + b * g.s[0];
                px_dy[tid] = b * c_out * plane + pix;
            } else {
                px_x[tid] = ~(u64)0;
            }
        }
        __syncthreads();
        for (int i = tid; i < quads * 4 * WGRAD_P; i += blockDim.x) {
            const int r = i / WGRAD_P, q = i % WGRAD_P;
            C v = 0;
            if (r < taps && px_x[q] != ~(u64)0) {
                const int iy = px_iy[q] + tap_y[r], ix = px_ix[q] + tap_x[r];
                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                    v = to_c(x[px_x[q] + (u64)tap_ch[r] * g.s[1] + (u64)iy * g.s[2] + (u64)ix * g.s[3]]);
            }
            xs[r * WGRAD_STRIDE + q] = v;
        }
        for (int i = tid; i < WGRAD_CO * WGRAD_P; i += blockDim.x) {
            const int k = i / WGRAD_P, q = i % WGRAD_P;
            C v = 0;
            if (px_x[q] != ~(u64)0 && co0 + k < c_out) v = to_c(dy[px_dy[q] + (co0 + k) * plane]);
            ds[k * WGRAD_STRIDE + q] = v;
        }
        __syncthreads();
        if (active) {
            for (int q = grp * 4; q < WGRAD_P; q += groups * 4) {
                C a[4][4], b[4][4];
#pragma unroll
                for (int i = 0; i < 4; ++i) load4(ds + (cq * 4 + i) * WGRAD_STRIDE + q, a[i]);
#pragma unroll
                for (int j = 0; j < 4; ++j) load4(xs + (rq * 4 + j) * WGRAD_STRIDE + q, b[j]);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
#pragma unroll
                        for (int k = 0; k < 4; ++k) acc[i][j] += a[i][k] * b[j][k];
            }
        }
    }
    __syncthreads();
    C* red = reinterpret_cast<C*>(raw);
    if (active) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) red[(grp * tiles + tile) * 16 + i * 4 + j] = acc[i][j];
    }
    __syncthreads();
    for (int e = tid; e < tiles * 16; e += blockDim.x) {
        const int t = e / 16, ij = e % 16;
        C sum = 0;
        for (int gg = 0; gg < groups; ++gg) sum += red[(gg * tiles + t) * 16 + ij];
        const int co = (t % (WGRAD_CO / 4)) * 4 + ij / 4, r = (t / (WGRAD_CO / 4)) * 4 + ij % 4;
        if (co0 + co < c_out && r < taps) partial[((co0 + co) * (u64)taps + r) * gridDim.x + blockIdx.x] = sum;
    }
}

// dw[e] = Σ over the `parts` partial sums of element e (stored [total][parts]): one warp per
// element, lane l adding parts l, l + 32, …, then a butterfly over the lanes (a fixed order).
// A thread per element walking hundreds of partials in sequence was latency-bound (the
// 2026-11-25 H100 run: most of the weight gradient's 0.09–0.13 ms).
template <typename T> __device__ void conv_direct_wgrad_sum_impl(const typename Compute<T>::type* partial, T* dw,
                                                                 u64 total, u64 parts) {
    typedef typename Compute<T>::type C;
    const u64 lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 e = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; e < total; e += warps) {
        C acc = 0;
        for (u64 c = lane; c < parts; c += 32) acc += partial[e * parts + c];
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) acc += shfl_xor(acc, m);
        if (lane == 0) dw[e] = from_c<T>(acc);
    }
}

// Weight gradient of a stride-1, dilation-1 convolution with few input channels, by rows:
// each step stages `rows` output rows of dy for 32 output channels of one image, and the
// zero-padded input rows they see, in shared memory (as f32). Lane = output channel, warp =
// (input channel, filter row): a thread keeps the KW sums of its filter row and walks the
// staged rows four pixels at a time, one 16-byte dy load (its own channel) and
// ⌈(KW+3)/4⌉ broadcast 16-byte x loads per 4·KW multiply-adds. Staging reads whole rows
// (coalesced, 16-byte loads where `vec`); the im2col staging of `conv_direct_wgrad` cost
// as much as its arithmetic. Blocks walk units (image, band of rows) in a fixed order and
// store their sums as partials for `conv_direct_wgrad_sum` (deterministic).
//   pitch: floats per channel in the dy stage, ≥ rows·owp and ≡ 4 (mod 8), so that the
//          16-byte loads of eight consecutive lanes hit distinct banks;
//   owp:   ow rounded up to 4 (the stage's zero-padded row); xw: floats per staged x row.
template <int KW> struct WgradRows { static const int NQ = (KW + 3 + 3) / 4; };
#define WGRAD_LOADS 8

template <typename T> __device__ __forceinline__ void load4_c(const T* p, bool vec, float (&o)[4]) {
    if (vec) {  // four 16-bit values in one 8-byte load
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        T h[4];
        h[0].bits = v.x & 0xffffu; h[1].bits = v.x >> 16; h[2].bits = v.y & 0xffffu; h[3].bits = v.y >> 16;
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = to_c(h[j]);
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = to_c(p[j]);
}
// f32 has no `.bits`: its vector path is the float4 load above.
template <> __device__ __forceinline__ void load4_c<float>(const float* p, bool vec, float (&o)[4]) {
    if (vec) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = p[j];
}

template <typename T, int KW>
__device__ void conv_wgrad_rows_impl(const T* x, const T* dy, float* partial, Win g, u64 c_out, int rows,
                                     int owp, int xw, int pitch, int vec) {
    extern __shared__ __align__(16) float wgrad_stage[];
    const int NQ = WgradRows<KW>::NQ;
    const int KH = (int)g.kh, C = (int)g.c, H = (int)g.h, W = (int)g.w;
    const int OH = (int)g.oh, OW = (int)g.ow, PH = (int)g.ph, PW = (int)g.pw;
    const int XR = rows + KH - 1;
    float* ds = wgrad_stage;               // [32][pitch]
    float* xs = wgrad_stage + 32 * pitch;  // [C][XR][xw]
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    const int ci = warp / KH, kh = warp % KH;  // the block has exactly C·KH warps
    const u64 co0 = (u64)blockIdx.y * 32;
    const int bands = (OH + rows - 1) / rows;
    const u64 units = g.n * (u64)bands;
    // Pad columns and missing channels stay zero: staging writes only real pixels.
    for (int i = tid; i < 32 * pitch; i += blockDim.x) ds[i] = 0.f;
    float acc[KW];
#pragma unroll
    for (int k = 0; k < KW; ++k) acc[k] = 0.f;
    for (u64 u = blockIdx.x; u < units; u += gridDim.x) {
        const u64 b = u / (u64)bands;
        const int oh0 = (int)(u - b * (u64)bands) * rows;
        const int here = OH - oh0 < rows ? OH - oh0 : rows;
        __syncthreads();  // the previous unit's reads (and the zeroing) are done
        const T* dy_unit = dy + (b * c_out + co0) * (u64)(OH * OW) + (u64)oh0 * OW;
        if (OW == owp) {
            // Quads (4 pixels) of the band, channel-major; WGRAD_LOADS of a thread's loads in
            // flight before their stores (one load, then its store, per round trip left
            // the staging latency-bound: 0.030 ms for b256 1→32 on the H100).
            const int per_channel = here * OW / 4, total = 32 * per_channel;
            for (int base = tid; base < total; base += WGRAD_LOADS * blockDim.x) {
                float v[WGRAD_LOADS][4];
                int at[WGRAD_LOADS];
#pragma unroll
                for (int u = 0; u < WGRAD_LOADS; ++u) {
                    const int q = base + u * blockDim.x;
                    const int co = q / per_channel, i = (q - co * per_channel) * 4;
                    at[u] = -1;
                    if (q < total && co0 + co < c_out) {
                        load4_c<T>(dy_unit + (u64)co * (OH * OW) + i, vec != 0, v[u]);
                        at[u] = co * pitch + i;
                    }
                }
#pragma unroll
                for (int u = 0; u < WGRAD_LOADS; ++u)
                    if (at[u] >= 0)
                        *reinterpret_cast<float4*>(ds + at[u]) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
            }
        } else {
            for (int co = warp; co < 32; co += warps) {
                if (co0 + co >= c_out) continue;
                const T* src = dy_unit + (u64)co * (OH * OW);
                float* dst = ds + co * pitch;
                for (int i = lane; i < here * OW; i += 32) {
                    const int r = i / OW, c = i - r * OW;
                    dst[r * owp + c] = to_c(src[i]);
                }
            }
        }
        const u64 xb = g.offset + b * g.s[0];
        for (int i = tid; i < C * XR * xw; i += blockDim.x) {
            const int xc = i % xw, t = i / xw, xr = t % XR, ch = t / XR;
            const int iy = oh0 + xr - PH, ix = xc - PW;
            float v = 0.f;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                v = to_c(x[xb + (u64)ch * g.s[1] + (u64)iy * g.s[2] + (u64)ix * g.s[3]]);
            xs[i] = v;
        }
        __syncthreads();
        const float* drow = ds + lane * pitch;
        const float* xrow = xs + (ci * XR + kh) * xw;
        for (int r = 0; r < here; ++r) {
            const float* dp = drow + r * owp;
            const float* xp = xrow + r * xw;
            for (int c = 0; c < owp; c += 4) {
                const float4 d = *reinterpret_cast<const float4*>(dp + c);
                float xv[4 * NQ];
#pragma unroll
                for (int q = 0; q < NQ; ++q) {
                    const float4 v = *reinterpret_cast<const float4*>(xp + c + 4 * q);
                    xv[4 * q] = v.x; xv[4 * q + 1] = v.y; xv[4 * q + 2] = v.z; xv[4 * q + 3] = v.w;
                }
#pragma unroll
                for (int k = 0; k < KW; ++k) {
                    acc[k] = fmaf(d.x, xv[k], acc[k]);
                    acc[k] = fmaf(d.y, xv[k + 1], acc[k]);
                    acc[k] = fmaf(d.z, xv[k + 2], acc[k]);
                    acc[k] = fmaf(d.w, xv[k + 3], acc[k]);
                }
            }
        }
    }
    if (co0 + lane < c_out) {
        const u64 taps = (u64)C * KH * KW;
        const u64 base = ((co0 + lane) * taps + (u64)(ci * KH + kh) * KW) * gridDim.x + blockIdx.x;
#pragma unroll
        for (int k = 0; k < KW; ++k) partial[base + (u64)k * gridDim.x] = acc[k];
    }
}

#define WGRAD_ROWS_KW(T, NAME, KW)                                                                        \
    extern "C" __global__ void conv_wgrad_rows##KW##_##NAME(const T* x, const T* dy, float* partial, Win g, \
                                                          u64 c_out, int rows, int owp, int xw, int pitch,  \
                                                          int vec) {                                       \
        conv_wgrad_rows_impl<T, KW>(x, dy, partial, g, c_out, rows, owp, xw, pitch, vec);                 \
    }
#define WGRAD_ROWS_FOR(T, NAME) WGRAD_ROWS_KW(T, NAME, 3) WGRAD_ROWS_KW(T, NAME, 5) WGRAD_ROWS_KW(T, NAME, 7)

#define WINDOW_FOR(T, NAME)                                                                            \
    extern "C" __global__ void unfold_##NAME(const T* x, T* col, Win g) { unfold_impl<T>(x, col, g); } \
    extern "C" __global__ void fold_##NAME(const T* col, T* x, Win g) { fold_impl<T>(col, x, g); }     \
    extern "C" __global__ void pool_##NAME(const T* x, T* y, u32* ids, Win g, int is_max) {            \
        pool_impl<T>(x, y, ids, g, is_max);                                                            \
    }                                                                                                  \
    extern "C" __global__ void pool_backward_##NAME(const T* gy, const u32* ids, T* dx, Win g,         \
                                                    int is_max) {                                      \
        pool_backward_impl<T>(gy, ids, dx, g, is_max);                                                 \
    }                                                                                                  \
    extern "C" __global__ void conv_bias_act_##NAME(T* y, const T* bias, u64 total, u64 c_out, u64 hw,   \
                                                    u64 b_stride, int relu) {                           \
        conv_bias_act_impl<T>(y, bias, total, c_out, hw, b_stride, relu);                                \
    }                                                                                                  \
    extern "C" __global__ void pool_tiled_##NAME(const T* x, T* y, u32* ids, Win g, int is_max) {        \
        pool_tiled_impl<T>(x, y, ids, g, is_max);                                                      \
    }                                                                                                  \
    extern "C" __global__ void pool_backward_tiled_##NAME(const T* gy, const u32* ids, T* dx, Win g,   \
                                                          int is_max) {                                \
        pool_backward_tiled_impl<T>(gy, ids, dx, g, is_max);                                           \
    }                                                                                                  \
    extern "C" __global__ void conv_direct_##NAME(const T* x, const T* w, T* y, Win g, u64 c_out,      \
                                                  const T* bias, int relu) {                           \
        conv_direct_impl<T, DIRECT_CO>(x, w, y, g, c_out, bias, relu);                                 \
    }                                                                                                  \
    extern "C" __global__ void conv_direct_wide_##NAME(const T* x, const T* w, T* y, Win g, u64 c_out, \
                                                       const T* bias, int relu) {                      \
        conv_direct_impl<T, 2 * DIRECT_CO>(x, w, y, g, c_out, bias, relu);                             \
    }                                                                                                  \
    extern "C" __global__ void conv_direct_wgrad_##NAME(const T* x, const T* dy,                       \
                                                        typename Compute<T>::type* partial, Win g,     \
                                                        u64 c_out, u64 chunk) {                        \
        conv_direct_wgrad_impl<T>(x, dy, partial, g, c_out, chunk);                                    \
    }                                                                                                  \
    extern "C" __global__ void conv_direct_wgrad_sum_##NAME(const typename Compute<T>::type* partial,  \
                                                            T* dw, u64 total, u64 parts) {             \
        conv_direct_wgrad_sum_impl<T>(partial, dw, total, parts);                                      \
    }

WINDOW_FOR(f16, f16)
WINDOW_FOR(bf16, bf16)
WINDOW_FOR(float, f32)
WINDOW_FOR(double, f64)
WGRAD_ROWS_FOR(f16, f16)
WGRAD_ROWS_FOR(bf16, bf16)
WGRAD_ROWS_FOR(float, f32)
