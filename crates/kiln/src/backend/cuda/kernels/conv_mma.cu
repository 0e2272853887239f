// Convolutions of few input channels (at most 64) on tensor cores: an implicit GEMM whose
// block computes a band of output rows of one image for 32 or 64 output channels.
//
// GEMM view: y[pixel, co] = sum over k = (tap, ci) of X[pixel, k] · W[k, co]. The block stages
// the input rows its band reads once, in shared memory, channel-innermost ([pixel][ci], the
// layout the MMA's fragments want, zeros around the image), then walks the filter's taps in
// groups of `tps`: a group's weights ([tap][co][ci], pre-arranged by `conv_mma_weights`, so a
// group of one channel tile is a few contiguous runs)
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

// wp[tap][co][ci] (co < co_pad, ci < row: rows as long as the staged pitch, so a tap's rows of
// one channel tile are one contiguous run that copies straight into shared memory) from the
// packed filter w, zeros beyond c_out and cin, TF32-rounded for f32. Without `flip`, w is
// [c_out][cin][taps]. With it, w is the filter of the transposed problem ([cin][c_out][taps]:
// the forward filter whose input gradient this convolution computes) and every tap is
// mirrored. One block per (tap, co) row (blockIdx.x = tap·co_pad + co), its threads over the
// row: no division per element.
template <typename T>
__device__ void conv_mma_weights_impl(const T* w, typename Mma<T>::S* wp, u64 c_out, u64 cin, u64 taps,
                                      u64 row, u64 co_pad, int flip) {
    const u64 r = blockIdx.x, co = r % co_pad, tap = r / co_pad;
    for (u64 ci = threadIdx.x; ci < row; ci += blockDim.x) {
        T v = from_c<T>(0);
        if (co < c_out && ci < cin)
            v = flip ? w[(ci * c_out + co) * taps + (taps - 1 - tap)] : w[(co * cin + ci) * taps + tap];
        wp[r * row + ci] = Mma<T>::stage(v);
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

    // Group q of the filter: taps [q·tps, +tps) (fewer in the last) into slot [tap][NT][pitch].
    // A tap's NT rows are one contiguous run of the prepared filter ([tap][co][pitch]), and
    // with one channel tile (co_pad = NT) so is the whole group: plain 16-byte copies. The
    // host keeps the prepared filter under 2^31 elements (32-bit offsets).
    const int groups = (taps + tps - 1) / tps;
    const u32 tap_chunks = NT * pitch * ESZ / 16, co_pad = gridDim.y * NT;
    auto load_group = [&](int q, int slot) {
        const u32 t0 = q * tps, count = min(tps, taps - (int)t0);
        const u32 dst0 = smem_u32(ws + slot * tps * NT * pitch);
        if (gridDim.y == 1) {
            const char* src = reinterpret_cast<const char*>(wp + t0 * NT * (u32)pitch);
            for (u32 i = threadIdx.x; i < count * tap_chunks; i += blockDim.x) cp_async16(dst0 + i * 16, src + i * 16);
        } else {
            for (u32 t = 0; t < count; ++t) {
                const char* src = reinterpret_cast<const char*>(wp + ((t0 + t) * co_pad + (u32)co0) * (u32)pitch);
                const u32 dst = dst0 + t * tap_chunks * 16;
                for (u32 i = threadIdx.x; i < tap_chunks; i += blockDim.x) cp_async16(dst + i * 16, src + i * 16);
            }
        }
    };
#pragma unroll
    for (int q = 0; q < MMA_STAGES - 1; ++q) {
        if (q < groups) load_group(q, q);
        cp_async_commit();
    }

    // The band's input, channel-innermost, zeros outside the image and beyond cin. Work item
    // (channel group, pixel of the band), the pixel fastest so that neighbouring threads read
    // neighbouring columns: a group is 32 bytes of staged channels, loaded together (one
    // pointer stepping by the channel stride) and stored as two 16-byte words.
    {
        constexpr int G = 32 / ESZ;
        const T* xb = x + g.offset + b * g.s[0];
        const int iy0 = oh0 * SH - PH;
        const i64 s1 = (i64)g.s[1], s2 = (i64)g.s[2], s3 = (i64)g.s[3];
        const int pixels = BH * BW, items = pixels * (cin_k / G);
        const bool whole = cin == cin_k;  // no channel of a group lies beyond cin
        for (int it = threadIdx.x; it < items; it += blockDim.x) {
            const int grp = (u32)it / (u32)pixels, px = it - grp * pixels;
            const int yy = (u32)px / (u32)BW, xx = px - yy * BW;
            const int iy = iy0 + yy, ix = xx - PW, c0 = grp * G;
            const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
            S v[G];
            const T* p = xb + (i64)iy * s2 + (i64)ix * s3 + c0 * s1;
            if (in && whole) {
#pragma unroll
                for (int u = 0; u < G; ++u) v[u] = Mma<T>::stage(p[u * s1]);
            } else if (in) {
#pragma unroll
                for (int u = 0; u < G; ++u) v[u] = Mma<T>::stage(c0 + u < cin ? p[u * s1] : from_c<T>(0));
            } else {
#pragma unroll
                for (int u = 0; u < G; ++u) v[u] = 0;
            }
            u32 word[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if constexpr (sizeof(S) == 2)
                    word[k] = (u32)v[2 * k] | ((u32)v[2 * k + 1] << 16);
                else
                    word[k] = (u32)v[k];
            }
            uint4* dst = reinterpret_cast<uint4*>(xs + px * pitch + c0);
            dst[0] = make_uint4(word[0], word[1], word[2], word[3]);
            dst[1] = make_uint4(word[4], word[5], word[6], word[7]);
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
    // This lane's first channel; later ones are whole multiples of `plane` further. A lane
    // walks its two channels' pointers by 8 channels at a time; channels past c_out are
    // skipped only in the last tile.
    const int co_lane = (int)co0 + 2 * tq;
    const bool all_co = co0 + NT <= c_out;
    const int c_out_i = (int)min(c_out, (u64)0x7fffffff);
    T* y_lane = y + (b * c_out + (u64)co_lane) * plane + (u64)oh0 * OW;
    const u64 step8 = 8 * plane;
#pragma unroll
    for (int mi = 0; mi < MMA_WM; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int m = warp * 32 + mi * 16 + gq + half * 8;
            if (m >= npx) continue;
            T* p0 = y_lane + m;  // the band's pixels are consecutive in the output plane
            T* p1 = p0 + plane;
#pragma unroll
            for (int ni = 0; ni < WN; ++ni) {
                float v0 = acc[mi][ni][half * 2] + bias_of[ni][0];
                float v1 = acc[mi][ni][half * 2 + 1] + bias_of[ni][1];
                if (relu) {  // NaN passes, as in add_relu
                    v0 = v0 <= 0.f ? 0.f : v0;
                    v1 = v1 <= 0.f ? 0.f : v1;
                }
                if (all_co || co_lane + ni * 8 < c_out_i) *p0 = from_c<T>(v0);
                if (all_co || co_lane + ni * 8 + 1 < c_out_i) *p1 = from_c<T>(v1);
                p0 += step8;
                p1 += step8;
            }
        }
}

#define CONV_MMA_FOR(T, NAME)                                                                          \
    extern "C" __global__ void conv_mma_weights_##NAME(const T* w, Mma<T>::S* wp, u64 c_out, u64 cin,   \
                                                       u64 taps, u64 row, u64 co_pad, int flip) {       \
        conv_mma_weights_impl<T>(w, wp, c_out, cin, taps, row, co_pad, flip);                            \
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
