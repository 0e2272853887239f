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
// Two kernels share this code (and the tensor-core building blocks of mma.cuh). conv_mma*
// issue mma.sync (sm_80 on), two m16 tiles of pixels per warp against every channel of the
// block. conv_wg* (sm_90a) issue Hopper's warpgroup MMA: four warps multiply m64 × NT × 32
// bytes of K at once, A still from the same ldmatrix fragments, B read by the tensor cores
// from shared memory, so the weights' fragments no longer pass through registers. Their
// weight slots hold [chunk of 16 bytes of ci][co][16 bytes], the layout a descriptor names.
// On the H100 (b256 32→64 14² 5×5, blocks of 12 warps, bench/tools/conv_wgmma) they take
// 0.0324 ms in TF32 and 0.0194–0.0198 in bf16, against 0.0396 and 0.0248–0.0250 for conv_mma
// (2026-11-28).
//
// The filter arrives prepared by conv_mma_weights, or, where the host finds the whole grid
// resident at once, each block prepares a slice of it while staging and the blocks meet once
// before the first weights load (load_slice … await_slices): one launch instead of two.
//
// Precision: f32 inputs are rounded to TF32 (cvt.rna) and only run here when TF32 is on;
// f16/bf16 multiply exactly into f32 accumulators. The result is rounded once, after the
// bias and ReLU.

#define MMA_STAGES 2
// The warpgroup-MMA kernels' weight slots, how many groups ahead they are filled, and the
// k-steps per committed batch of MMAs.
// H100, b256 32→64 14² 5×5 (bench/tools/conv_wgmma): 3 slots one group ahead 0.0324 ms
// (TF32) against 0.0343 for 4 slots two ahead and 0.0339 for 5 three ahead; batches of 2
// steps within 2%.
#ifndef WG_STAGES
#define WG_STAGES 3
#endif
#ifndef WG_AHEAD
#define WG_AHEAD 1
#endif
#ifndef WG_BATCH
#define WG_BATCH 4
#endif
// m16 tiles per warp: a warp computes 32 pixels × all of the block's channels.
#define MMA_WM 2

// The 16-byte units staged after each band row of `bw` pixels (rows of `units` units, `units`
// odd): the eight rows of an ldmatrix are pixels sw·units units apart within an output row,
// distinct banks mod 8; padding the band row to ≡ ow·sw·units (mod 8) units keeps them so
// when the eight wrap into the next output row. conv_mma.rs mirrors this (row_pad_units).
__host__ __device__ __forceinline__ int conv_mma_row_pad(int bw, int ow, int sw, int units) {
    return (((ow * sw - bw) * units) % 8 + 8) % 8;
}

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
// Element (tap t, output channel co, input channel ci) of the packed filter w: [c_out][cin]
// [taps], or with `flip` the transposed problem's [cin][c_out][taps] with the taps mirrored.
template <typename T>
__device__ __forceinline__ typename Mma<T>::S packed_element(const T* w, u64 t, u64 co, u64 ci, u64 c_out, u64 cin,
                                                             u64 taps, int flip) {
    return Mma<T>::stage(flip ? w[(ci * c_out + co) * taps + (taps - 1 - t)] : w[(co * cin + ci) * taps + t]);
}
template <typename T>
__device__ void conv_mma_weights_impl(const T* w, typename Mma<T>::S* wp, u64 c_out, u64 cin, u64 taps,
                                      u64 row, u64 co_pad, int flip, u32 chunk, int chunked) {
    typedef typename Mma<T>::S S;
    __shared__ __align__(16) S buf[CONV_MMA_PREP_BYTES / sizeof(S)];
    const u64 co = blockIdx.x;
    const bool real = co < c_out;
    for (u64 t0 = 0; t0 < taps; t0 += chunk) {
        const u32 len = (u32)min((u64)chunk, taps - t0);
        if (real)
            for (u32 i = threadIdx.x; i < (u32)cin * len; i += blockDim.x) {
                const u32 ci = i / len, t = i - ci * len;
                buf[i] = packed_element(w, t0 + t, co, ci, c_out, cin, taps, flip);
            }
        __syncthreads();
        for (u32 i = threadIdx.x; i < len * (u32)row; i += blockDim.x) {
            const u32 t = i / (u32)row, ci = i - t * (u32)row;
            const S v = real && ci < cin ? buf[ci * len + t] : (S)0;
            if (chunked) {
                const u32 per = 16 / sizeof(S), k = ci / per;
                wp[(((t0 + t) * (row / per) + k) * co_pad + co) * per + (ci - k * per)] = v;
            } else {
                wp[((t0 + t) * co_pad + co) * row + ci] = v;
            }
        }
        __syncthreads();
    }
}

// Element o of the prepared filter (the layout conv_mma_weights writes, `chunked` for the
// warpgroup kernels) from the packed filter w: its (tap, co, ci), then the packed element,
// zero beyond c_out and cin. For the convolution kernels' fused preparation.
template <typename T>
__device__ typename Mma<T>::S prepared_element(const T* w, u32 o, u32 c_out, u32 cin, u32 taps, u32 row,
                                               u32 co_pad, int flip, bool chunked) {
    u32 t, co, ci;
    if (chunked) {
        const u32 per = 16 / sizeof(typename Mma<T>::S), e = o % per, r1 = o / per, r2 = r1 / co_pad;
        const u32 chunks = row / per;
        co = r1 - r2 * co_pad;
        t = r2 / chunks;
        ci = (r2 - t * chunks) * per + e;
    } else {
        const u32 r = o / row;
        ci = o - r * row;
        t = r / co_pad;
        co = r - t * co_pad;
    }
    return co < c_out && ci < cin ? packed_element(w, t, co, ci, c_out, cin, taps, flip) : 0;
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u32 load_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The filter preparation fused into a convolution launch (the host passes `meet`, a zeroed
// pair of device counters, only when every block of the grid can be resident at once and a
// block's slice is at most SLICE_PER_THREAD elements a thread): block b prepares slice b of
// wp while it stages its band (load_slice, then store_slice), announces it in meet[0], and
// before its first weights load waits until every block has (await_slices). This saves the
// preparing kernel's launch, 3.4–6.0 µs of a 14² 5×5 forward of 0.040–0.044 ms timed from an
// idle device, of which fusing saves a median 2.2 (bench/tools/conv_wgmma, H100). A block
// that still finds the count short after `wait_ns` (its grid not all resident after all:
// other work on the GPU) prepares the whole filter itself: every writer writes the same
// values, so that is safe, only slower. The last block past the meeting zeroes the counters
// for the next launch, a replayed graph's included.
#define SLICE_PER_THREAD 2
struct SliceArgs {
    u32 c_out, cin, taps, row, co_pad;
    int flip;
    bool chunked;
    __device__ u32 total() const { return co_pad * taps * row; }
};
template <typename T> struct Slice {
    typename Mma<T>::S v[SLICE_PER_THREAD];
    u32 begin, end;
};
template <typename T> __device__ Slice<T> load_slice(const T* w, const SliceArgs& a) {
    const u32 blocks = gridDim.x * gridDim.y, total = a.total();
    const u32 per = (total + blocks - 1) / blocks, b = blockIdx.y * gridDim.x + blockIdx.x;
    Slice<T> sl;
    sl.begin = min(total, b * per);
    sl.end = min(total, sl.begin + per);
#pragma unroll
    for (int k = 0; k < SLICE_PER_THREAD; ++k) {
        const u32 o = sl.begin + threadIdx.x + k * blockDim.x;
        sl.v[k] = o < sl.end ? prepared_element(w, o, a.c_out, a.cin, a.taps, a.row, a.co_pad, a.flip, a.chunked) : 0;
    }
    return sl;
}
// Elements [begin, end) of wp, the block's threads striding through them.
template <typename T>
__device__ void prepare_range(const T* w, typename Mma<T>::S* wp, u32 begin, u32 end, const SliceArgs& a) {
    for (u32 o = begin + threadIdx.x; o < end; o += blockDim.x)
        wp[o] = prepared_element(w, o, a.c_out, a.cin, a.taps, a.row, a.co_pad, a.flip, a.chunked);
}
template <typename T>
__device__ void store_slice(const T* w, typename Mma<T>::S* wp, const Slice<T>& sl, const SliceArgs& a) {
#pragma unroll
    for (int k = 0; k < SLICE_PER_THREAD; ++k) {
        const u32 o = sl.begin + threadIdx.x + k * blockDim.x;
        if (o < sl.end) wp[o] = sl.v[k];
    }
    // Slices longer than the host allows, done plainly.
    prepare_range(w, wp, min(sl.end, sl.begin + SLICE_PER_THREAD * blockDim.x), sl.end, a);
}
__device__ __forceinline__ void announce_slice(u32* meet) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(meet, 1u);
}
template <typename T>
__device__ void await_slices(const T* w, typename Mma<T>::S* wp, u32* meet, u64 wait_ns, const SliceArgs& a) {
    const u32 blocks = gridDim.x * gridDim.y;
    int late = 0;
    if (threadIdx.x == 0) {
        const u64 start = global_ns();
        while (load_acquire(meet) < blocks) {
            if (global_ns() - start >= wait_ns) {
                late = 1;
                break;
            }
            __nanosleep(100);
        }
        if (atomicAdd(meet + 1, 1u) == blocks - 1) {
            atomicExch(meet, 0u);
            atomicExch(meet + 1, 0u);
        }
    }
    if (__syncthreads_or(late)) {
        prepare_range(w, wp, 0, a.total(), a);
        __threadfence();
        __syncthreads();
    }
}

// Band pixels [from, to) (band row · BW + column) of a block's staged band into xs, by thread
// tid of nthreads, pixel from + tid + k·nthreads: each of the pixel's cin_k channels (zeros
// outside the image and beyond cin), TF32-rounded for f32, stored channel-innermost at row
// pitch RS and pixel pitch `pitch`. xb is the band's first image; its first rows0 staged rows
// start at input row iy0, the later images' segments are rows_full rows each. A pixel's
// position, image and input row are worked out once for all its channels, and up to four
// 32-byte groups of channels are loaded before any is stored: neighbouring threads read
// neighbouring columns of one channel. (Per 32-byte item, with the position worked out per
// item, the 14² 5×5 forward's staging was bound by its instructions: session 48.)
template <typename T>
__device__ __forceinline__ void stage_band(const T* xb, const Win& g, typename Mma<T>::S* xs, int RS, int pitch,
                                           int cin_k, int BW, int iy0, int rows0, int rows_full, int from, int to,
                                           int tid, int nthreads) {
    typedef typename Mma<T>::S S;
    constexpr int G = 32 / sizeof(S), UNROLL = 4;
    const int H = (int)g.h, W = (int)g.w, PH = (int)g.ph, PW = (int)g.pw, cin = (int)g.c;
    const i64 s0 = (i64)g.s[0], s1 = (i64)g.s[1], s2 = (i64)g.s[2], s3 = (i64)g.s[3];
    const int ngroups = cin_k / G;
    for (int px = from + tid; px < to; px += nthreads) {
        const int yy = (u32)px / (u32)BW, xx = px - yy * BW;
        int iy = iy0 + yy;
        i64 img = 0;
        if (yy >= rows0) {
            const int r = yy - rows0, j = (u32)r / (u32)rows_full;
            img = 1 + j;
            iy = r - j * rows_full - PH;
        }
        const int ix = xx - PW;
        const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
        const T* p = xb + img * s0 + (i64)iy * s2 + (i64)ix * s3;
        uint4* dst = reinterpret_cast<uint4*>(xs + yy * RS + xx * pitch);
        for (int g0 = 0; g0 < ngroups; g0 += UNROLL) {
            S v[UNROLL][G];
#pragma unroll
            for (int q = 0; q < UNROLL; ++q) {
                const int c0 = (g0 + q) * G;
                const T* pq = p + c0 * s1;
                if (in && c0 + G <= cin) {
#pragma unroll
                    for (int u = 0; u < G; ++u) v[q][u] = Mma<T>::stage(pq[u * s1]);
                } else if (in && c0 < cin) {
#pragma unroll
                    for (int u = 0; u < G; ++u) v[q][u] = Mma<T>::stage(c0 + u < cin ? pq[u * s1] : from_c<T>(0));
                } else {
#pragma unroll
                    for (int u = 0; u < G; ++u) v[q][u] = 0;
                }
            }
#pragma unroll
            for (int q = 0; q < UNROLL; ++q) {
                if (g0 + q >= ngroups) break;
                u32 word[8];
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    if constexpr (sizeof(S) == 2)
                        word[k] = (u32)v[q][2 * k] | ((u32)v[q][2 * k + 1] << 16);
                    else
                        word[k] = (u32)v[q][k];
                }
                dst[2 * (g0 + q)] = make_uint4(word[0], word[1], word[2], word[3]);
                dst[2 * (g0 + q) + 1] = make_uint4(word[4], word[5], word[6], word[7]);
            }
        }
    }
}

// The epilogue of a warp's m16n8 accumulator tiles, stored straight to NCHW y: lane (gq, tq)
// holds, for pixel row gq (+8 in the second half) of a tile, channels 2·tq and 2·tq + 1 of
// each n8 tile. Conv_bias loads this lane's biases (0 past c_out); conv_store_row adds them
// to half `half` of one m16 tile's accumulators, applies ReLU (NaN passes, as in add_relu)
// and writes its channels from y0 (channel co_lane of the pixel) on, 8 planes a tile, skipping
// channels at or past c_out unless all_co.
template <typename T, int WN>
__device__ __forceinline__ void conv_bias(const T* bias, u64 co0, int tq, u64 c_out, float (&bias_of)[WN][2]) {
#pragma unroll
    for (int ni = 0; ni < WN; ++ni)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u64 co = co0 + ni * 8 + 2 * tq + j;
            bias_of[ni][j] = bias && co < c_out ? (float)to_c(bias[co]) : 0.f;
        }
}
template <typename T, int WN>
__device__ __forceinline__ void conv_store_row(const float (&acc)[WN][4], int half, const float (&bias_of)[WN][2],
                                               int relu, T* y0, u64 plane, bool all_co, int co_lane, int c_out_i) {
    T* y1 = y0 + plane;
    const u64 step8 = 8 * plane;
#pragma unroll
    for (int ni = 0; ni < WN; ++ni) {
        float v0 = acc[ni][half * 2] + bias_of[ni][0];
        float v1 = acc[ni][half * 2 + 1] + bias_of[ni][1];
        if (relu) {
            v0 = v0 <= 0.f ? 0.f : v0;
            v1 = v1 <= 0.f ? 0.f : v1;
        }
        if (all_co || co_lane + ni * 8 < c_out_i) *y0 = from_c<T>(v0);
        if (all_co || co_lane + ni * 8 + 1 < c_out_i) *y1 = from_c<T>(v1);
        y0 += step8;
        y1 += step8;
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
// host sizing the staged rows for the largest range. With `meet` set, the kernel prepares wp
// itself from the packed filter w_raw (load_slice … await_slices), waiting at most `wait_ns` for the
// other blocks' slices.
template <typename T, int WN, bool WG>
__device__ void conv_mma_impl(const T* x, typename Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias,
                              int relu, int rows, int cin_k, int pitch, int tps, const T* w_raw, int flip,
                              u32* meet, u64 wait_ns) {
    typedef typename Mma<T>::S S;
#if !defined(KILN_WGMMA)
    if constexpr (WG) {  // the host launches WG kernels on sm_90 only, compiled for sm_90a
        __trap();
        return;
    }
#endif
    const int ESZ = (int)sizeof(S);
    const int NT = 8 * WN;
    extern __shared__ __align__(16) unsigned char conv_mma_smem[];
    const int OH = (int)g.oh, OW = (int)g.ow;
    const int KH = (int)g.kh, KW = (int)g.kw, SH = (int)g.sh, SW = (int)g.sw;
    const int PH = (int)g.ph, DH = (int)g.dh, DW = (int)g.dw;
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
    // Staged rows lie RS elements apart: BW pixels of `pitch`, then conv_mma_row_pad 16-byte
    // units, so the eight pixels of an ldmatrix that wraps into the next output row still
    // hit distinct banks.
    const int RS = BW * pitch + conv_mma_row_pad(BW, OW, SW, pitch * ESZ / 16) * (16 / ESZ);
    // The weight slots; wgmma's descriptors want them 128-byte aligned (the host adds 128
    // bytes to the shared memory of a WG launch).
    S* ws = xs + BH * RS;
    if constexpr (WG) ws = reinterpret_cast<S*>((reinterpret_cast<u64>(ws) + 127) & ~(u64)127);
    const u64 co0 = (u64)blockIdx.y * NT;

    // Group q of the filter: taps [q·tps, +tps) (fewer in the last) into slot [tap][NT][row].
    // A tap's NT rows are one contiguous run of the prepared filter ([tap][co][row], row =
    // pitch), and with one channel tile (co_pad = NT) so is the whole group: plain 16-byte
    // copies. For WG the prepared filter is [tap][16-byte chunk of ci][co][chunk] (row =
    // cin_k), so a channel tile is one run per (tap, chunk). The host keeps the prepared
    // filter under 2^31 elements (32-bit offsets).
    const int groups = (taps + tps - 1) / tps;
    const int row = WG ? cin_k : pitch;
    const u32 tap_chunks = NT * row * ESZ / 16, co_pad = gridDim.y * NT;
    auto load_group = [&](int q, int slot) {
        const u32 t0 = q * tps, count = min(tps, taps - (int)t0);
        const u32 dst0 = smem_u32(ws + slot * tps * NT * row);
        if (gridDim.y == 1) {
            const char* src = reinterpret_cast<const char*>(wp + t0 * NT * (u32)row);
            for (u32 i = threadIdx.x; i < count * tap_chunks; i += blockDim.x) cp_async16(dst0 + i * 16, src + i * 16);
        } else if (WG) {
            // Run (t, chunk) of NT 16-byte rows: item i = (run, row within it).
            const u32 chunks = row * ESZ / 16;
            for (u32 i = threadIdx.x; i < count * tap_chunks; i += blockDim.x) {
                const u32 run = i / NT, co = i - run * NT;
                const char* src = reinterpret_cast<const char*>(
                    wp + ((t0 * chunks + run) * co_pad + (u32)co0 + co) * (16 / ESZ));
                cp_async16(dst0 + i * 16, src);
            }
        } else {
            for (u32 t = 0; t < count; ++t) {
                const char* src = reinterpret_cast<const char*>(wp + ((t0 + t) * co_pad + (u32)co0) * (u32)pitch);
                const u32 dst = dst0 + t * tap_chunks * 16;
                for (u32 i = threadIdx.x; i < tap_chunks; i += blockDim.x) cp_async16(dst + i * 16, src + i * 16);
            }
        }
    };
    const int ahead = WG ? WG_AHEAD : MMA_STAGES - 1;
    auto prologue = [&]() {
        for (int q = 0; q < ahead; ++q) {
            if (q < groups) load_group(q, q);
            cp_async_commit();
        }
    };
    const SliceArgs slice_args{(u32)c_out, (u32)cin, (u32)taps, (u32)row, co_pad, flip, WG};
    Slice<T> slice;
    if (meet)
        slice = load_slice(w_raw, slice_args);
    else
        prologue();

    // The band's input, channel-innermost (stage_band). With a fused preparation, staging
    // goes in quarters: the slice is stored after the first, announced after the second (its
    // stores long done), and awaited after the third, before the first weights load.
    {
        const T* xb = x + g.offset + b0 * g.s[0];
        const int iy0 = oh_first * SH - PH, pixels = BH * BW;
        auto stage = [&](int from, int to) {
            stage_band(xb, g, xs, RS, pitch, cin_k, BW, iy0, rows0, rows_full, from, to, threadIdx.x, blockDim.x);
        };
        const int quarter = pixels / (4 * blockDim.x) * blockDim.x;
        if (meet) {
            stage(0, quarter);
            store_slice(w_raw, wp, slice, slice_args);
            stage(quarter, 2 * quarter);
            announce_slice(meet);
            stage(2 * quarter, 3 * quarter);
            await_slices(w_raw, wp, meet, wait_ns, slice_args);
            prologue();
            stage(3 * quarter, pixels);
        } else {
            stage(0, pixels);
        }
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // A warpgroup MMA needs its four warps: with WG a warp past the range computes (pixel 0's
    // rows) and stores nothing.
    const bool active = (u32)(WG ? warp & ~3 : warp) * 32 < npx;
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
        a_row[mi] = smem_u32(xs + row * RS + c * SW * pitch) + (lane >> 4) * 16;
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
#if defined(KILN_WGMMA)
    if constexpr (WG) {
        // Step s of a group: tap s / ksteps of the group, 32 bytes of channels s % ksteps.
        // Steps go in batches of WG_BATCH: one fence, the batch's MMAs, one commit. The A
        // fragments of the next batch load into the other buffer while a batch runs; waiting
        // for all but the last committed batch frees that buffer first. With WG_STAGES slots
        // filled WG_AHEAD groups ahead, the slot a group overwrites was read two groups
        // earlier, which that same wait has completed: barriers never drain the MMAs.
        // B of step st is 2·LBO bytes past step st − 1's (a tap's rows are ksteps·2 chunks
        // of NT rows), so a descriptor is the slot's plus st·2·LBO/16. A's offset advances by
        // a cursor: 32 bytes a step, a column of taps after ksteps, a row after KW columns.
        const u32 lbo = NT * 16;
        const u64 desc_hi = ((u64)(lbo >> 4) << 16) | ((u64)(128 >> 4) << 32);
        const u32 col_step = (u32)(DW * pitch * ESZ) - (u32)(ksteps * 32);
        const u32 row_step = (u32)((DH * RS - KW * DW * pitch) * ESZ);
        typedef u32 Frag[WG_BATCH][MMA_WM][4];
        Frag fa, fb;
        u32 a_off = 0;
        int a_kc = 0, a_col = 0;
        auto load_batch = [&](int b, int steps, Frag& a) {
#pragma unroll
            for (int k = 0; k < WG_BATCH; ++k) {
                if (b * WG_BATCH + k >= steps) break;
#pragma unroll
                for (int mi = 0; mi < MMA_WM; ++mi) ldsm_x4(a[k][mi], a_row[mi] + a_off);
                a_off += 32;
                if (++a_kc == ksteps) {
                    a_kc = 0;
                    a_off += col_step;
                    if (++a_col == KW) a_col = 0, a_off += row_step;
                }
            }
        };
        // The MMAs of step st from fragments a. Each fence … commit region is free of
        // branches: ptxas serializes every wgmma of the kernel otherwise (C7520).
        auto mma_step = [&](u64 desc0, int st, const u32 (&a)[MMA_WM][4]) {
            const u64 desc = desc0 + (u64)(st * (2 * lbo >> 4));
#pragma unroll
            for (int mi = 0; mi < MMA_WM; ++mi) wg_mma<T, WN>(&acc[mi][0][0], a[mi], desc);
        };
        // Batch b: one region for a whole batch, one per step for the group's last, partial
        // one.
        auto mma_batch = [&](u64 desc0, int b, int steps, const Frag& a) {
            const int st0 = b * WG_BATCH;
            if (st0 + WG_BATCH <= steps) {
                wg_fence();
#pragma unroll
                for (int k = 0; k < WG_BATCH; ++k) mma_step(desc0, st0 + k, a[k]);
                wg_commit();
            } else {
#pragma unroll
                for (int k = 0; k < WG_BATCH - 1; ++k) {
                    if (st0 + k < steps) {
                        wg_fence();
                        mma_step(desc0, st0 + k, a[k]);
                        wg_commit();
                    }
                }
            }
        };
        // One group's batches, starting with buffer `first`.
        auto run_group = [&](u64 desc0, int steps, Frag& first, Frag& second) {
            const int nb = (steps + WG_BATCH - 1) / WG_BATCH;
            load_batch(0, steps, first);
            for (int b = 0; b < nb; b += 2) {
                mma_batch(desc0, b, steps, first);
                if (b + 1 < nb) {
                    wg_wait<1>();
                    load_batch(b + 1, steps, second);
                    mma_batch(desc0, b + 1, steps, second);
                }
                if (b + 2 < nb) {
                    wg_wait<1>();
                    load_batch(b + 2, steps, first);
                }
            }
            return nb;
        };
        fence_operands(acc);
        bool start_b = false;  // the last batch in flight used fa: start the next group on fb
        for (int q = 0; q < groups; ++q) {
            cp_async_wait<WG_AHEAD - 1>();
            fence_proxy_async();
            wg_wait<1>();     // every batch but the last: group q - 2's slot is free
            __syncthreads();  // this group's weights (and, the first time, the band) are visible
            if (q + WG_AHEAD < groups) load_group(q + WG_AHEAD, (q + WG_AHEAD) % WG_STAGES);
            cp_async_commit();
            if (!active) continue;
            const int steps = min(tps, taps - q * tps) * ksteps;
            const u32 slot = smem_u32(ws + (q % WG_STAGES) * tps * NT * cin_k);
            const u64 desc0 = desc_hi | (u64)((slot & 0x3FFFF) >> 4);
            const int nb = start_b ? run_group(desc0, steps, fb, fa) : run_group(desc0, steps, fa, fb);
            start_b ^= (nb & 1) != 0;
        }
        wg_wait<0>();
        fence_operands(acc);
    } else
#endif
    {
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
            const u32 a_tap = (u32)((r * DH * RS + s * DW * pitch) * ESZ);
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
    }
    cp_async_wait<0>();

    // Accumulator q of tile (mi, ni): pixel row gq (+8 for q ≥ 2), channel 2·tq + (q & 1).
    const int gq = lane >> 2, tq = lane & 3;
    if constexpr (sizeof(T) == 2) {
        // 16-bit outputs go through shared memory, free once every warp is past its MMAs:
        // each lane writes its accumulators (with bias and ReLU, rounded) into a
        // [channel][pixel] tile, then thread t stores pixel t of every channel, so a warp
        // writes 64 consecutive bytes of one plane. Stored straight from the accumulators,
        // an instruction wrote four 16-byte pieces of four planes (half-sectors): on an
        // H200 the 14² 5×5 bf16 forward went 0.0219 → 0.0192 ms (wgmma) and 0.0272 →
        // 0.0246 (mma.sync) this way (bench/tools/conv_wgmma). f32 pieces are whole
        // sectors already, and there the extra barrier cost the overlap of some warps'
        // stores with others' MMAs (28² 3×3 TF32 0.0147 → 0.0166 ms; measured again
        // 2026-11-28 on an H100 with a conflict-free pitch: 14² 5×5 0.0323 → 0.0318–0.0322,
        // 28² 3×3 0.0150 → 0.0169–0.0171), so f32 stores directly. The pitch (P + 8) puts
        // the four channel pairs of a store on distinct banks; the host sizes shared memory
        // for NT rows.
        __syncthreads();
        const int ldo = (int)blockDim.x + 8;
        T* tile = reinterpret_cast<T*>(conv_mma_smem);
#pragma unroll
        for (int ni = 0; ni < WN; ++ni)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int c = ni * 8 + 2 * tq + j;
                const u64 co = co0 + c;
                const float b = bias && co < c_out ? (float)to_c(bias[co]) : 0.f;
#pragma unroll
                for (int mi = 0; mi < MMA_WM; ++mi)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        float v = acc[mi][ni][half * 2 + j] + b;
                        if (relu) v = v <= 0.f ? 0.f : v;  // NaN passes, as in add_relu
                        tile[c * ldo + warp * 32 + mi * 16 + gq + half * 8] = from_c<T>(v);
                    }
            }
        __syncthreads();
        if (threadIdx.x < npx) {
            // Pixel pp of image b0 + img: consecutive pixels of one image are consecutive
            // in its output plane, and the next image's planes are c_out planes further.
            u32 img, pp;
            locate(threadIdx.x, img, pp);
            T* dst = y + ((b0 + img) * c_out + co0) * plane + pp;
            const int channels = (int)min((u64)NT, c_out - co0);
            for (int c = 0; c < channels; ++c) dst[(u64)c * plane] = tile[c * ldo + threadIdx.x];
        }
        return;
    }
    float bias_of[WN][2];
    conv_bias<T, WN>(bias, co0, tq, c_out, bias_of);
    // This lane's first channel; later ones are whole multiples of `plane` further. A lane
    // walks its two channels' pointers by 8 channels at a time; channels past c_out are
    // skipped only in the last tile.
    const int co_lane = (int)co0 + 2 * tq;
    const bool all_co = co0 + NT <= c_out;
    const int c_out_i = (int)min(c_out, (u64)0x7fffffff);
    T* y_lane = y + (b0 * c_out + (u64)co_lane) * plane;
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
            conv_store_row<T, WN>(acc[mi], half, bias_of, relu, y_lane + (u64)img * c_out * plane + pp, plane, all_co,
                                  co_lane, c_out_i);
        }
}

// One convolution kernel: KIND (mma or wg) with WN n8 tiles of channels, under its launch
// bound (mma.sync: 256 threads, 2 blocks an SM; warpgroup: 384 threads, 1 block).
#define CONV_MMA_KERNEL(T, NAME, KIND, CH, WN, WG, THREADS, BLOCKS)                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS) conv_##KIND##CH##_##NAME(                \
        const T* x, Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int rows, int cin_k, \
        int pitch, int tps, const T* w_raw, int flip, u32* meet, u64 wait_ns) {                         \
        conv_mma_impl<T, WN, WG>(x, wp, y, g, c_out, bias, relu, rows, cin_k, pitch, tps, w_raw, flip, meet, \
                                 wait_ns);                                                             \
    }
#define CONV_MMA_FOR(T, NAME)                                                                          \
    extern "C" __global__ void conv_mma_weights_##NAME(const T* w, Mma<T>::S* wp, u64 c_out, u64 cin,   \
                                                       u64 taps, u64 row, u64 co_pad, int flip,         \
                                                       u32 chunk, int chunked) {                        \
        conv_mma_weights_impl<T>(w, wp, c_out, cin, taps, row, co_pad, flip, chunk, chunked);            \
    }                                                                                                  \
    CONV_MMA_KERNEL(T, NAME, mma, 32, 4, false, 256, 2)                                                \
    CONV_MMA_KERNEL(T, NAME, mma, 64, 8, false, 256, 2)                                                \
    CONV_MMA_KERNEL(T, NAME, wg, 32, 4, true, 384, 1)                                                  \
    CONV_MMA_KERNEL(T, NAME, wg, 64, 8, true, 384, 1)

CONV_MMA_FOR(f16, f16)
CONV_MMA_FOR(bf16, bf16)
CONV_MMA_FOR(float, f32)
