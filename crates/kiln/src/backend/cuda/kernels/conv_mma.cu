// Convolutions of few input channels (at most 64) on tensor cores: an implicit GEMM whose
// block computes a band of output rows of one image for 32 or 64 output channels.
//
// GEMM view: y[pixel, co] = sum over k = (tap, ci) of X[pixel, k] · W[k, co]. The block stages
// the input rows its band reads once, in shared memory, channel-innermost ([pixel][ci], the
// layout the MMA's fragments want, zeros around the image), then walks the filter's taps in
// groups of `tps`: a group's weights ([tap][co][ci], pre-arranged by `conv_mma_weights`)
// arrive by cp.async into one of MMA_STAGES slots while the previous group computes. A tap's
// A operand is the staged band shifted by the tap's offset, so no im2col matrix exists
// anywhere. Fragments come by
// ldmatrix: a row of the band (a pixel's channels) and a row of the weights (an output
// channel's) are 16-byte rows, and their pitch is an odd multiple of 16 bytes so the eight
// rows of one 8×8 matrix hit distinct banks.
//
// Precision: f32 inputs are rounded to TF32 (cvt.rna) and only run here when TF32 is on;
// f16/bf16 multiply exactly into f32 accumulators. The result is rounded once, after the
// bias and ReLU.

#define MMA_STAGES 2
// m16 tiles per warp: a warp computes 32 pixels × all of the block's channels.
#define MMA_WM 2
// Channels each lane loads before storing them, while staging the band.
#define MMA_STAGE_BATCH 8

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// Per dtype: the element as staged (TF32 bits, or the 16-bit bits) and one m16n8 MMA over
// 32 bytes of channels (k8 for TF32, k16 for 16-bit), accumulating in f32.
template <typename T> struct Mma;
template <> struct Mma<float> {
    typedef u32 S;
    __device__ static S stage(float v) {
        u32 r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
        return r;
    }
    __device__ static void run(float* d, const u32* a, const u32* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<bf16> {
    typedef unsigned short S;
    __device__ static S stage(bf16 v) { return v.bits; }
    __device__ static void run(float* d, const u32* a, const u32* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<f16> {
    typedef unsigned short S;
    __device__ static S stage(f16 v) { return v.bits; }
    __device__ static void run(float* d, const u32* a, const u32* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// wp[co][tap][ci] (co < co_pad, ci < cin_k) from the packed filter w, zeros beyond c_out and
// cin, TF32-rounded for f32. Without `flip`, w is [c_out][cin][taps]. With it, w is the
// filter of the transposed problem ([cin][c_out][taps]: the forward filter whose input
// gradient this convolution computes) and every tap is mirrored.
template <typename T>
__device__ void conv_mma_weights_impl(const T* w, typename Mma<T>::S* wp, u64 c_out, u64 cin, u64 taps,
                                      u64 cin_k, u64 co_pad, int flip) {
    GRID_LOOP(i, co_pad * taps * cin_k) {
        const u64 ci = i % cin_k, rest = i / cin_k, tap = rest % taps, co = rest / taps;
        T v = from_c<T>(0);
        if (co < c_out && ci < cin)
            v = flip ? w[(ci * c_out + co) * taps + (taps - 1 - tap)] : w[(co * cin + ci) * taps + tap];
        wp[i] = Mma<T>::stage(v);
    }
}

// The forward convolution (stride, padding and dilation any; one group). Block (x = image ×
// band, y = channel tile) computes output rows [band·rows, +rows) of one image for channels
// [y·8·WN, +8·WN); a warp per 32 pixels of the band. `pitch` (elements) is the staged row
// length: cin_k rounded so a row is an odd number of 16-byte units; `tps` taps share a weight
// slot. Dynamic shared memory: (BH·BW + MMA_STAGES·tps·8·WN) · pitch elements.
template <typename T, int WN>
__device__ void conv_mma_impl(const T* x, const typename Mma<T>::S* wp, T* y, Win g, u64 c_out,
                              const T* bias, int relu, int rows, int cin_k, int pitch, int tps) {
    typedef typename Mma<T>::S S;
    const int ESZ = (int)sizeof(S);
    const int NT = 8 * WN;
    extern __shared__ __align__(16) unsigned char conv_mma_smem[];
    const int H = (int)g.h, W = (int)g.w, OH = (int)g.oh, OW = (int)g.ow;
    const int KH = (int)g.kh, KW = (int)g.kw, SH = (int)g.sh, SW = (int)g.sw;
    const int PH = (int)g.ph, PW = (int)g.pw, DH = (int)g.dh, DW = (int)g.dw;
    const int taps = KH * KW, cin = (int)g.c;
    const int BW = (OW - 1) * SW + (KW - 1) * DW + 1, BH = (rows - 1) * SH + (KH - 1) * DH + 1;
    S* xs = reinterpret_cast<S*>(conv_mma_smem);
    S* ws = xs + BH * BW * pitch;

    const int bands = (OH + rows - 1) / rows;
    const u64 b = blockIdx.x / bands;
    const int oh0 = (int)(blockIdx.x % bands) * rows;
    const int npx = min(rows, OH - oh0) * OW;
    const u64 co0 = (u64)blockIdx.y * NT;

    // Group q of the filter: taps [q·tps, +tps) (fewer in the last), NT rows of cin_k elements
    // a tap, 16 bytes per cp.async, into slot [tap][NT][pitch].
    const int chunks = cin_k * ESZ / 16, groups = (taps + tps - 1) / tps;
    // Thread i copies chunks i, i + blockDim.x, ... of a group: its first (row, chunk) and
    // its step, found once; a row is (tap, n), n fastest.
    const int c_first = threadIdx.x % chunks, row_first = threadIdx.x / chunks;
    const int c_step = blockDim.x % chunks, row_step = blockDim.x / chunks;
    const S* w_tile = wp + co0 * (u64)taps * cin_k;
    auto load_group = [&](int q, int slot) {
        const int t0 = q * tps, rows_here = min(tps, taps - t0) * NT;
        const u32 dst0 = smem_u32(ws + slot * tps * NT * pitch);
        int c = c_first, row = row_first;
        while (row < rows_here) {
            const int n = row % NT, t = row / NT;  // NT is a power of two
            const S* src = w_tile + ((u64)n * taps + t0 + t) * cin_k + c * (16 / ESZ);
            cp_async16(dst0 + (row * pitch + c * (16 / ESZ)) * ESZ, src);
            c += c_step;
            row += row_step;
            if (c >= chunks) c -= chunks, ++row;
        }
    };
#pragma unroll
    for (int q = 0; q < MMA_STAGES - 1; ++q) {
        if (q < groups) load_group(q, q);
        cp_async_commit();
    }

    // The band's input, channel-innermost, zeros outside the image and beyond cin. Lanes take
    // columns and warps rows, so a row's bounds and address are computed once for all its
    // channels; each lane loads MMA_STAGE_BATCH channels before storing them (16-bit ones in
    // pairs).
    {
        const int nwarps = blockDim.x >> 5, wid = threadIdx.x >> 5, ln = threadIdx.x & 31;
        const T* xb = x + g.offset + b * g.s[0];
        const int iy0 = oh0 * SH - PH;
        const i64 s1 = (i64)g.s[1];
        for (int xx = ln; xx - ln < BW; xx += 32) {
            const int ix = xx - PW;
            const bool col_ok = xx < BW, col_in = col_ok && ix >= 0 && ix < W;
            for (int yy = wid; yy < BH; yy += nwarps) {
                const int iy = iy0 + yy;
                const bool in = col_in && iy >= 0 && iy < H;
                const T* xr = xb + (in ? (i64)iy * (i64)g.s[2] + (i64)ix * (i64)g.s[3] : 0);
                S* dst = xs + (yy * BW + xx) * pitch;
                for (int c0 = 0; c0 < cin_k; c0 += MMA_STAGE_BATCH) {
                    S v[MMA_STAGE_BATCH];
#pragma unroll
                    for (int u = 0; u < MMA_STAGE_BATCH; ++u)
                        v[u] = Mma<T>::stage(in && c0 + u < cin ? xr[(c0 + u) * s1] : from_c<T>(0));
                    if (!col_ok) continue;
                    if constexpr (sizeof(S) == 2) {
#pragma unroll
                        for (int u = 0; u < MMA_STAGE_BATCH; u += 2)
                            *reinterpret_cast<u32*>(dst + c0 + u) = (u32)v[u] | ((u32)v[u + 1] << 16);
                    } else {
#pragma unroll
                        for (int u = 0; u < MMA_STAGE_BATCH; ++u) dst[c0 + u] = v[u];
                    }
                }
            }
        }
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool active = warp * 32 < npx;
    // ldmatrix row addresses. A: lanes 0-15 give pixels 0-15 of an m16 tile at channel
    // bytes 0-15 of the k-step, lanes 16-31 the same pixels at bytes 16-31. B: lanes 0-7
    // and 16-23 give channels 0-7 and 8-15 at bytes 0-15, lanes 8-15 and 24-31 at 16-31.
    u32 a_row[MMA_WM];
#pragma unroll
    for (int mi = 0; mi < MMA_WM; ++mi) {
        int m = warp * 32 + mi * 16 + (lane & 15);
        if (m >= npx) m = 0;  // computed, never stored
        const int r = m / OW, c = m - r * OW;
        a_row[mi] = smem_u32(xs + (r * SH * BW + c * SW) * pitch) + (lane >> 4) * 16;
    }
    const u32 b_row = smem_u32(ws + ((lane & 7) + ((lane >> 4) << 3)) * pitch) + ((lane >> 3) & 1) * 16;
    const u32 tap_bytes = NT * pitch * ESZ, ntile16 = 16 * pitch * ESZ;

    float acc[MMA_WM][WN][4];
#pragma unroll
    for (int mi = 0; mi < MMA_WM; ++mi)
#pragma unroll
        for (int ni = 0; ni < WN; ++ni)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.f;

    const int ksteps = cin_k * ESZ / 32;
    int r = 0, s = 0;  // the filter row and column of the next tap
    for (int q = 0; q < groups; ++q) {
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();  // this group's weights (and, the first time, the band) are visible
        if (q + MMA_STAGES - 1 < groups) load_group(q + MMA_STAGES - 1, (q + MMA_STAGES - 1) % MMA_STAGES);
        cp_async_commit();
        const int count = min(tps, taps - q * tps);
        if (!active) continue;
        const u32 b_slot = b_row + (q % MMA_STAGES) * tps * tap_bytes;
        for (int t = 0; t < count; ++t) {
            const u32 a_tap = (u32)((r * DH * BW + s * DW) * pitch * ESZ);
            const u32 b_tap = b_slot + t * tap_bytes;
            if (++s == KW) s = 0, ++r;
#pragma unroll 2
            for (int kc = 0; kc < ksteps; ++kc) {
                u32 a[MMA_WM][4], bf[WN][2];
#pragma unroll
                for (int mi = 0; mi < MMA_WM; ++mi) ldsm_x4(a[mi], a_row[mi] + a_tap + kc * 32);
#pragma unroll
                for (int nj = 0; nj < WN / 2; ++nj) {
                    u32 f[4];
                    ldsm_x4(f, b_tap + nj * ntile16 + kc * 32);
                    bf[2 * nj][0] = f[0];
                    bf[2 * nj][1] = f[1];
                    bf[2 * nj + 1][0] = f[2];
                    bf[2 * nj + 1][1] = f[3];
                }
#pragma unroll
                for (int mi = 0; mi < MMA_WM; ++mi)
#pragma unroll
                    for (int ni = 0; ni < WN; ++ni) Mma<T>::run(acc[mi][ni], a[mi], bf[ni]);
            }
        }
    }
    cp_async_wait<0>();

    // Accumulator q of tile (mi, ni): pixel row gq (+8 for q ≥ 2), channel 2·tq + (q & 1).
    const int gq = lane >> 2, tq = lane & 3;
    const u64 plane = (u64)OH * OW;
    float bias_of[WN][2];
#pragma unroll
    for (int ni = 0; ni < WN; ++ni)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u64 co = co0 + ni * 8 + 2 * tq + j;
            bias_of[ni][j] = bias && co < c_out ? (float)to_c(bias[co]) : 0.f;
        }
    // This lane's first channel; later ones are whole multiples of `plane` further.
    const u64 co_lane = co0 + 2 * tq;
    T* y_lane = y + (b * c_out + co_lane) * plane + (u64)oh0 * OW;
#pragma unroll
    for (int mi = 0; mi < MMA_WM; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int m = warp * 32 + mi * 16 + gq + half * 8;
            if (m >= npx) continue;
            T* yp = y_lane + m;  // the band's pixels are consecutive in the output plane
#pragma unroll
            for (int ni = 0; ni < WN; ++ni)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    if (co_lane + ni * 8 + j >= c_out) continue;
                    float v = acc[mi][ni][half * 2 + j] + bias_of[ni][j];
                    if (relu) v = v <= 0.f ? 0.f : v;  // NaN passes, as in add_relu
                    yp[(ni * 8 + j) * plane] = from_c<T>(v);
                }
        }
}

#define CONV_MMA_FOR(T, NAME)                                                                          \
    extern "C" __global__ void conv_mma_weights_##NAME(const T* w, Mma<T>::S* wp, u64 c_out, u64 cin,   \
                                                       u64 taps, u64 cin_k, u64 co_pad, int flip) {     \
        conv_mma_weights_impl<T>(w, wp, c_out, cin, taps, cin_k, co_pad, flip);                          \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 2) conv_mma32_##NAME(                               \
        const T* x, const Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int rows,     \
        int cin_k, int pitch, int tps) {                                                               \
        conv_mma_impl<T, 4>(x, wp, y, g, c_out, bias, relu, rows, cin_k, pitch, tps);                  \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 2) conv_mma64_##NAME(                               \
        const T* x, const Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int rows,     \
        int cin_k, int pitch, int tps) {                                                               \
        conv_mma_impl<T, 8>(x, wp, y, g, c_out, bias, relu, rows, cin_k, pitch, tps);                  \
    }

CONV_MMA_FOR(f16, f16)
CONV_MMA_FOR(bf16, bf16)
CONV_MMA_FOR(float, f32)
