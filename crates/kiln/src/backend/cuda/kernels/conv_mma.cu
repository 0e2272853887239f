// Convolutions of few input channels (at most 64) on tensor cores: an implicit GEMM whose
// block computes a band of output rows of one image, or a range of consecutive output pixels
// that may span images, for 32 or 64 output channels.
//
// GEMM view: y[pixel, co] = sum over k = (tap, ci) of X[pixel, k] · W[k, co]. The block stages
// the input rows its pixels read once, in shared memory, channel-innermost ([pixel][ci], the
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
// mirrored. One block per output channel: it reads the channel's filter (cin runs of taps,
// contiguous without `flip`) into shared memory, `chunk` taps at a time (the host keeps
// cin·chunk within CONV_MMA_PREP_BYTES), and writes each tap's row. One block per (tap, co)
// row, each thread reading one scattered element, took 4.1–4.4 µs for a 64×32×5×5 filter on
// the H100 (ncu, 2026-11-27), a tenth of the convolution it prepared.
#define CONV_MMA_PREP_BYTES 8192
template <typename T>
__device__ void conv_mma_weights_impl(const T* w, typename Mma<T>::S* wp, u64 c_out, u64 cin, u64 taps,
                                      u64 row, u64 co_pad, int flip, u32 chunk) {
    typedef typename Mma<T>::S S;
    __shared__ __align__(16) S buf[CONV_MMA_PREP_BYTES / sizeof(S)];
    const u64 co = blockIdx.x;
    const bool real = co < c_out;
    for (u64 t0 = 0; t0 < taps; t0 += chunk) {
        const u32 len = (u32)min((u64)chunk, taps - t0);
        if (real)
            for (u32 i = threadIdx.x; i < (u32)cin * len; i += blockDim.x) {
                const u32 ci = i / len, t = i - ci * len;
                const u64 tap = t0 + t;
                buf[i] = Mma<T>::stage(flip ? w[(ci * c_out + co) * taps + (taps - 1 - tap)]
                                            : w[(co * cin + ci) * taps + tap]);
            }
        __syncthreads();
        for (u32 i = threadIdx.x; i < len * (u32)row; i += blockDim.x) {
            const u32 t = i / (u32)row, ci = i - t * (u32)row;
            wp[((t0 + t) * co_pad + co) * row + ci] = real && ci < cin ? buf[ci * len + t] : (S)0;
        }
        __syncthreads();
    }
}

// The forward convolution (stride, padding and dilation any; one group). Block (x, y = channel
// tile) computes a range of output pixels of the flattened (image, row, column) space for
// channels [y·8·WN, +8·WN); a warp per 32 pixels of the range. With `rows` > 0 the range is a
// band of `rows` output rows of one image (block x = image × band); with `rows` = 0 it is
// pixels [x·P, +P), P = the block's threads, which may span several images: the staged band is
// then one segment of input rows per image, one after the other, so every pixel of the range
// still finds its taps at fixed offsets from its own row. `pitch` (elements) is the staged row
// length: cin_k rounded so a row is an odd number of 16-byte units; `tps` taps share a weight
// slot. Dynamic shared memory: (staged rows · BW + MMA_STAGES·tps·8·WN) · pitch elements, the
// host sizing the staged rows for the largest range.
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
    const int BW = (OW - 1) * SW + (KW - 1) * DW + 1, span_h = (KH - 1) * DH + 1;
    // Staged rows of a whole image's segment.
    const int rows_full = (OH - 1) * SH + span_h;

    // This block's pixels: [m0, m0 + npx) of the flattened output, starting at pixel p0 of
    // image b0 and ending in image b0 + nimg - 1 at its row oh_last.
    const u32 plane = (u32)OH * (u32)OW;
    u64 b0;
    u32 p0, npx;
    if (rows > 0) {
        const u32 bands = (u32)(OH + rows - 1) / (u32)rows;
        b0 = blockIdx.x / bands;
        const u32 oh0 = (blockIdx.x % bands) * (u32)rows;
        p0 = oh0 * (u32)OW;
        npx = min((u32)rows, (u32)OH - oh0) * (u32)OW;
    } else {
        const u64 m0 = (u64)blockIdx.x * blockDim.x;
        b0 = m0 / plane;
        p0 = (u32)(m0 - b0 * plane);
        npx = (u32)min((u64)blockDim.x, g.n * plane - m0);
    }
    const u32 last = p0 + npx - 1;  // relative to image b0's first pixel
    const u32 nimg = last / plane + 1;
    const int oh_first = (int)(p0 / (u32)OW), oh_last = (int)((last - (nimg - 1) * plane) / (u32)OW);
    // Staged rows of the first image's segment, then of the whole band.
    const int rows0 = ((nimg == 1 ? oh_last : OH - 1) - oh_first) * SH + span_h;
    const int BH = nimg == 1 ? rows0 : rows0 + (int)(nimg - 2) * rows_full + oh_last * SH + span_h;
    // Local pixel i as (image b0 + img, pixel pp of that image's plane).
    auto locate = [&](u32 i, u32& img, u32& pp) {
        const u32 q = p0 + i;
        img = q / plane;
        pp = q - img * plane;
    };
    S* xs = reinterpret_cast<S*>(conv_mma_smem);
    S* ws = xs + BH * BW * pitch;
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
    // pointer stepping by the channel stride) and stored as two 16-byte words. Each thread
    // loads two items before storing either, so twice the loads are in flight.
    {
        constexpr int G = 32 / ESZ;
        const i64 s0 = (i64)g.s[0], s1 = (i64)g.s[1], s2 = (i64)g.s[2], s3 = (i64)g.s[3];
        const T* xb = x + g.offset + b0 * g.s[0];
        const int iy0 = oh_first * SH - PH;
        const int pixels = BH * BW, items = pixels * (cin_k / G);
        const bool whole = cin == cin_k;  // no channel of a group lies beyond cin
        auto load = [&](int it, S* v) {
            const int grp = (u32)it / (u32)pixels, px = it - grp * pixels;
            const int yy = (u32)px / (u32)BW, xx = px - yy * BW;
            // The staged row's image (segment) and input row.
            int iy = iy0 + yy;
            i64 img = 0;
            if (yy >= rows0) {
                const int t = yy - rows0, j = (u32)t / (u32)rows_full;
                img = 1 + j;
                iy = t - j * rows_full - PH;
            }
            const int ix = xx - PW, c0 = grp * G;
            const bool in = it < items && iy >= 0 && iy < H && ix >= 0 && ix < W;
            const T* p = xb + img * s0 + (i64)iy * s2 + (i64)ix * s3 + c0 * s1;
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
        };
        auto store = [&](int it, const S* v) {
            if (it >= items) return;
            const int grp = (u32)it / (u32)pixels, px = it - grp * pixels;
            u32 word[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if constexpr (sizeof(S) == 2)
                    word[k] = (u32)v[2 * k] | ((u32)v[2 * k + 1] << 16);
                else
                    word[k] = (u32)v[k];
            }
            uint4* dst = reinterpret_cast<uint4*>(xs + px * pitch + grp * G);
            dst[0] = make_uint4(word[0], word[1], word[2], word[3]);
            dst[1] = make_uint4(word[4], word[5], word[6], word[7]);
        };
        for (int it = threadIdx.x; it < items; it += 2 * blockDim.x) {
            S v0[G], v1[G];
            load(it, v0);
            load(it + blockDim.x, v1);
            store(it, v0);
            store(it + blockDim.x, v1);
        }
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool active = (u32)warp * 32 < npx;
    // ldmatrix row addresses. A: lanes 0-15 give pixels 0-15 of an m16 tile at channel
    // bytes 0-15 of the k-step, lanes 16-31 the same pixels at bytes 16-31. B: lanes 0-7
    // and 16-23 give channels 0-7 and 8-15 at bytes 0-15, lanes 8-15 and 24-31 at 16-31.
    u32 a_row[MMA_WM];
#pragma unroll
    for (int mi = 0; mi < MMA_WM; ++mi) {
        u32 i = warp * 32 + mi * 16 + (lane & 15);
        if (i >= npx) i = 0;  // computed, never stored
        u32 img, pp;
        locate(i, img, pp);
        const int r = (int)(pp / (u32)OW), c = (int)pp - r * OW;
        const int row = img == 0 ? (r - oh_first) * SH : rows0 + (int)(img - 1) * rows_full + r * SH;
        a_row[mi] = smem_u32(xs + (row * BW + c * SW) * pitch) + (lane >> 4) * 16;
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
    T* y_lane = y + (b0 * c_out + (u64)co_lane) * plane;
    const u64 step8 = 8 * (u64)plane;
#pragma unroll
    for (int mi = 0; mi < MMA_WM; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const u32 i = warp * 32 + mi * 16 + gq + half * 8;
            if (i >= npx) continue;
            // Pixel pp of image b0 + img: consecutive pixels of one image are consecutive
            // in its output plane, and the next image's planes are c_out planes further.
            u32 img, pp;
            locate(i, img, pp);
            T* y0 = y_lane + (u64)img * c_out * plane + pp;
            T* y1 = y0 + plane;
#pragma unroll
            for (int ni = 0; ni < WN; ++ni) {
                float v0 = acc[mi][ni][half * 2] + bias_of[ni][0];
                float v1 = acc[mi][ni][half * 2 + 1] + bias_of[ni][1];
                if (relu) {  // NaN passes, as in add_relu
                    v0 = v0 <= 0.f ? 0.f : v0;
                    v1 = v1 <= 0.f ? 0.f : v1;
                }
                if (all_co || co_lane + ni * 8 < c_out_i) *y0 = from_c<T>(v0);
                if (all_co || co_lane + ni * 8 + 1 < c_out_i) *y1 = from_c<T>(v1);
                y0 += step8;
                y1 += step8;
            }
        }
}

#define CONV_MMA_FOR(T, NAME)                                                                          \
    extern "C" __global__ void conv_mma_weights_##NAME(const T* w, Mma<T>::S* wp, u64 c_out, u64 cin,   \
                                                       u64 taps, u64 row, u64 co_pad, int flip,         \
                                                       u32 chunk) {                                     \
        conv_mma_weights_impl<T>(w, wp, c_out, cin, taps, row, co_pad, flip, chunk);                     \
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
