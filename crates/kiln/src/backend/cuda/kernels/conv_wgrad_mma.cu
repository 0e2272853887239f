// Weight gradients on tensor cores (TF32; bf16/f16 widened exactly, see wgrad_mma_issue):
// dW[co][ci][kh][kw] = Σ over (image, oh, ow) of
// dy[n][co][oh][ow] · x[n][ci][oh·sh − ph + kh·dh][ow·sw − pw + kw·dw], for layers of few
// channels where cuDNN's engines pay for layout passes and split-K launches around a GEMM of
// a 50 176-deep reduction (b256 32→64 14² 5×5: 79 µs on the H200, of which its GEMM is 55).
//
// GEMM view: M = output channels (a tile of 16·MT), N = (input channel, tap), K = pixels. A
// block owns one output-channel tile, 8·G input channels and every tap; warp (g, kh) owns
// input channels 8g…8g+7 of the block and filter row kh, all KW taps of it (SW ≥ KW
// accumulator tiles, one per tap, against the same A fragments). The block walks units
// (image, band of `bh` output rows) from blockIdx.x in steps of gridDim.x. Each unit's dy
// ([co][pixel], zeros past the band) and the input rows it reads ([ci][row][col], the
// image's columns from col0, zeros around) arrive by cp.async in one of two stages while
// the other is multiplied; a pass then rounds the stage to TF32 (to nearest). A k-step is 8
// consecutive pixels of the band: A (dy) by ldmatrix, B (x shifted by the tap) by one
// scalar load per register at each thread's two pixels' offsets (a table per band), the
// next step's B loaded during this step's MMAs. The sums stay in registers across units and
// leave in fragment order (WgradFrag; a warp stores 512 contiguous bytes), and
// `conv_wgrad_mma_sum` adds the blocks' partials in a fixed order onto [c_out][c][kh][kw]
// (deterministic). With `bias_part`, the blocks also sum each unit's raw dy rows per output
// channel before they are rounded, the rows shared out over the channel groups: the bias
// gradient, added up by the same sum kernel.
//
// Measured (H200, b256 32→64 14² 5×5, bench/tools/conv_wgrad): 45 µs, 51 with the partials'
// sum, 54 with the bias too, against cuDNN's 83 (weight) and 104 (weight and bias) through
// PyTorch; an MMA-bound kernel would take 15–20. ncu of an earlier version found the staging
// issuing as many instructions as the MMA loop (division and 64-bit address arithmetic per
// 4-byte copy); carried indices and 8-byte copies halved the time. ncu of this one: the
// MMA loop holds 40% of the warps' stall samples, the barrier after it 11% (10 warps on 4
// schedulers: two hold 3, two hold 2, and the MMAs of the 3 set the pace), the copies and
// the rounding pass ~20%. Issuing the copies from the less busy schedulers' warps only
// (so that they fill the others' MMA time) measured slower: 54 against 45 µs.
//
// Shared-memory pitches, chosen by the host (conv_wgrad_mma.rs):
//   dp: floats per staged dy row, ≥ the band's pixels rounded up to 8, ≡ 4 (mod 8): the eight
//       rows of an ldmatrix (channels dp apart) fall in distinct 16-byte bank groups;
//   xp: floats per staged input plane, ≥ xh·xw, ≡ 4 (mod 8): the B loads of a warp (8
//       channels xp apart × 4 consecutive pixels) fall in distinct banks.

#ifndef WGRAD_MMA_THREADS
#define WGRAD_MMA_THREADS 320
#endif
#ifndef WGRAD_MMA_BLOCKS
#define WGRAD_MMA_BLOCKS 1
#endif

// The staging geometry, chosen by the host (conv_wgrad_mma.rs mirrors it).
struct WgradMma {
    int bh;      // output rows per unit
    int dp;      // words per staged dy row: ≥ the band's pixels rounded up to 8, ≡ 4 (mod 8)
    int xh, xw;  // staged input rows per unit, words per staged row (even)
    int xp;      // words per staged input plane: ≥ xh·xw, ≡ 4 (mod 8)
    int col0;    // staged column of input column 0 (≥ pw; even with `pairs`)
    int pairs;   // input rows copied 8 bytes at a time (even width, unit stride, aligned rows)
    int vec;     // dy rows copied 16 bytes at a time (aligned rows)
};

// How the sums of one launch sit in its partials: per block (x, y, z) of the grid, warps ×
// MT × SW × 32 lanes × 4 floats in fragment order (each thread's floats contiguous, so a warp
// stores 512 contiguous bytes); conv_wgrad_mma_sum maps them onto the filter gradient.
struct WgradFrag {
    int mt, sw, warps, kh_n, kw_n, grid_y;
    u64 c, c_out;
};

__device__ __forceinline__ u32 tf32_bits(float v) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// cp.async of `bytes` (< the copy size: the rest zero-filled; 0: all zeros) from src.
__device__ __forceinline__ void cp_async16_fill(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async8_fill(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4_fill(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// One unit's geometry: image b, output rows oh0 … oh0 + here − 1.
struct WgradUnit {
    u64 b;
    int oh0, here;
    __device__ __forceinline__ WgradUnit(u64 u, int bands, int bh, int OH) {
        b = u / (u64)bands;
        oh0 = (int)(u - b * (u64)bands) * bh;
        here = min(OH - oh0, bh);
    }
};

// cp.async of BYTES (4, 8 or 16) to dst, `bytes` of them from src and the rest zero-filled.
template <int BYTES> __device__ __forceinline__ void cp_async_fill(u32 dst, const void* src, u32 bytes) {
    if constexpr (BYTES == 16)
        cp_async16_fill(dst, src, bytes);
    else if constexpr (BYTES == 8)
        cp_async8_fill(dst, src, bytes);
    else
        cp_async4_fill(dst, src, bytes);
}

// The dy part of wgrad_mma_issue: rows 0 … CO − 1 of [CO][dp] elements from `src` (rows
// `plane` elements apart, the first `real_rows` real, `npix` elements each), zero-filled to
// p8; a warp a row, PER elements a copy (16 bytes for f32 with `vec`, 8 for 16-bit: rows
// aligned to that).
template <typename T, int PER, int CO>
__device__ __forceinline__ void wgrad_mma_issue_dy(const T* dy, const T* src, u32 ds, u64 plane, int real_rows,
                                                   int npix, int p8, int dp) {
    constexpr int E = sizeof(T);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const T* s_row = src + (u64)warp * plane;
    const u64 s_step = (u64)warps * plane;
    u32 d_row = ds + warp * dp * E;
    for (int co = warp; co < CO; co += warps, s_row += s_step, d_row += warps * dp * E) {
        const int real = co < real_rows ? npix : 0;
        for (int p = lane * PER; p < p8; p += 32 * PER) {
            const int left = min(max(real - p, 0), PER);
            const T* s = left ? s_row + p : dy;
            cp_async_fill<PER * E>(d_row + p * E, s, E * left);
        }
    }
}

// Starts the copies of unit `w` into one stage: ds ([CO][dp] of dy, zeros past the band's
// pixels and past c_out) and xs (the band's input rows, [CI][xh][xw], the image's columns
// from col0 on; rows outside the image and channels past c zero-filled; the columns around
// the image are never written, zero from the start). f32 lands raw in the stage (a pass
// then rounds it to TF32). 16-bit inputs (bf16, f16: exact in TF32, so the same MMAs give
// exact products and f32 sums, as 16-bit MMAs would) land as 16-bit elements in a raw
// buffer laid out like the stage (element i is word i of the stage), half the bytes; a
// widening pass then writes each element's f32 bits into the stage. A warp copies a dy row
// at a time (its lanes along the row), 4 elements a copy with `vec`, else 1 (f32) or 2
// (16-bit); an input row goes to `seg` threads, each copying every seg-th chunk of it (two
// elements with `pairs`, which 16-bit requires: even widths, strides and offsets), so that
// one thread's row, its source and its destination are worked out once for several copies.
template <typename T, int CO>
__device__ __forceinline__ void wgrad_mma_issue(const T* x, const T* dy, u32 ds, u32 xs, const Win& g, u64 c_out,
                                                u64 co0, int ci0, int CI, WgradUnit w, const WgradMma& m) {
    constexpr int E = sizeof(T);
    const int T_ = blockDim.x, tid = threadIdx.x;
    const int OW = (int)g.ow, npix = w.here * OW, p8 = (npix + 7) & ~7;
    const u64 plane = g.oh * g.ow;
    const T* src = dy + (w.b * c_out + co0) * plane + (u64)w.oh0 * OW;
    const int real_rows = (int)min(c_out - co0, (u64)CO);
    if (m.vec)
        wgrad_mma_issue_dy<T, 4, CO>(dy, src, ds, plane, real_rows, npix, p8, m.dp);
    else
        wgrad_mma_issue_dy<T, E == 2 ? 2 : 1, CO>(dy, src, ds, plane, real_rows, npix, p8, m.dp);
    const int C = (int)g.c, H = (int)g.h, W = (int)g.w;
    const int ih0 = w.oh0 * (int)g.sh - (int)g.ph;
    const T* xb = x + g.offset + w.b * g.s[0];
    const int per = E == 2 || m.pairs ? 2 : 1, c_n = W / per, rows = CI * m.xh;
    // seg: the fewest threads a row (a power of two, at most the row's chunks) that keep
    // half the block busy.
    int sl = 0;
    while ((rows << sl) < T_ / 2 && (2 << sl) <= c_n) ++sl;
    const int seg = 1 << sl, items = rows << sl;
    for (int i = tid; i < items; i += T_) {
        const int row = i >> sl, c0 = i & (seg - 1);
        const int cl = row / m.xh, r = row - cl * m.xh;
        const int ci = ci0 + cl, ih = ih0 + r;
        const bool real = ci < C && ih >= 0 && ih < H;
        const u32 dst = xs + (cl * m.xp + r * m.xw + m.col0) * E;
        const T* s = real ? xb + (u64)ci * g.s[1] + (u64)ih * g.s[2] : x;
        const u64 step = real ? (u64)per * g.s[3] : 0;
        if (E == 4 && m.pairs)
            for (int c = c0; c < c_n; c += seg) cp_async_fill<8>(dst + c * 8, s + c * step, real ? 8u : 0u);
        else
            for (int c = c0; c < c_n; c += seg) cp_async_fill<4>(dst + c * 4, s + c * step, real ? 4u : 0u);
    }
}

// stage[i] = the f32 bits of raw element i (exact), for i < words (a multiple of 8).
template <typename T>
__device__ __forceinline__ void wgrad_mma_widen(u32* stage, const u32* raw, int words) {
    for (int i = threadIdx.x * 8; i < words; i += blockDim.x * 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + i / 2);
        const u32 h[4] = {v.x, v.y, v.z, v.w};
        u32 o[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            T lo, hi;
            lo.bits = (unsigned short)(h[j] & 0xffffu);
            hi.bits = (unsigned short)(h[j] >> 16);
            o[2 * j] = __float_as_uint(to_c(lo));
            o[2 * j + 1] = __float_as_uint(to_c(hi));
        }
        *reinterpret_cast<uint4*>(stage + i) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(stage + i + 4) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

// Adds the first p8 words (a multiple of 8: the band's pixels and the zeros after them; the
// words past p8 may hold an earlier, longer band's) of each raw staged dy row ([CO][dp])
// co ≡ blockIdx.y (mod gridDim.y) into bias_acc[co], a warp per row (fixed lane order and
// shuffle tree: deterministic). The channel groups share the rows out, so no block carries
// the whole bias.
__device__ __forceinline__ void wgrad_mma_bias_rows(const u32* rows, int CO, int dp, int p8, float* bias_acc) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5, step = (int)gridDim.y * warps;
    // Four rows at a time, so that their loads and shuffle trees overlap.
    for (int co = (int)blockIdx.y + (int)gridDim.y * (threadIdx.x >> 5); co < CO; co += 4 * step) {
        float t[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            t[j] = 0.f;
            if (co + j * step >= CO) continue;
            const u32* row = rows + (co + j * step) * dp;
            for (int i = lane * 4; i < p8; i += 128) {
                const uint4 v = *reinterpret_cast<const uint4*>(row + i);
                t[j] += (__uint_as_float(v.x) + __uint_as_float(v.y)) + (__uint_as_float(v.z) + __uint_as_float(v.w));
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < 4; ++j) t[j] += __shfl_xor_sync(0xffffffffu, t[j], o);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (co + j * step < CO) bias_acc[co + j * step] += t[j];
    }
}

// Rounds `words` staged words (a multiple of 4) to TF32 in place.
__device__ __forceinline__ void wgrad_mma_round(u32* stage, int words) {
    for (int i = threadIdx.x * 4; i < words; i += blockDim.x * 4) {
        uint4 v = *reinterpret_cast<uint4*>(stage + i);
        v.x = tf32_bits(__uint_as_float(v.x));
        v.y = tf32_bits(__uint_as_float(v.y));
        v.z = tf32_bits(__uint_as_float(v.z));
        v.w = tf32_bits(__uint_as_float(v.w));
        *reinterpret_cast<uint4*>(stage + i) = v;
    }
}

// One k-step (8 pixels): A (dy) of its MT channel tiles by ldmatrix at a_addr, B (x) given
// in `cur`; B of the next step is loaded into `next` from the offsets of pixels `pn`
// (+ tq, + tq + 4) meanwhile, so the MMAs never wait on the offsets' loads.
template <int MT, int SW>
__device__ __forceinline__ void wgrad_mma_step(float (&acc)[MT][SW][4], u32 a_addr, int dp, const u32 (&cur)[SW][2],
                                               u32 (&next)[SW][2], const u32* xs_lane, const int* off_pn) {
    u32 af[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) ldsm_x4(af[i], a_addr + i * 16 * dp * 4);
    const u32* xa = xs_lane + off_pn[0];
    const u32* xb = xs_lane + off_pn[4];
#pragma unroll
    for (int k = 0; k < SW; ++k) {
        next[k][0] = xa[k];
        next[k][1] = xb[k];
    }
#pragma unroll
    for (int k = 0; k < SW; ++k)
#pragma unroll
        for (int i = 0; i < MT; ++i) Mma<float>::run(acc[i][k], af[i], cur[k]);
}

template <typename T, int MT, int SW>
__device__ void conv_wgrad_mma_impl(const T* __restrict__ x, const T* __restrict__ dy,
                                    float* __restrict__ partial, float* __restrict__ bias_part, Win g, u64 c_out,
                                    WgradMma m) {
    // f32: two stages, the copies landing in one while the other is multiplied. 16-bit: one
    // stage and two raw buffers of half its size (the copies land in one raw buffer while
    // the stage, widened from the other, is multiplied): the same shared memory.
    constexpr bool WIDE = sizeof(T) == 2;
    extern __shared__ __align__(16) u32 wgrad_mma_stage[];
    const int KH = (int)g.kh, OH = (int)g.oh, OW = (int)g.ow;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int kh = warp % KH, gw = warp / KH, CI = 8 * (warps / KH);
    constexpr int CO = 16 * MT;
    const u64 co0 = (u64)blockIdx.z * CO;
    const int ci0 = (int)blockIdx.y * CI;
    // Two stages of [CO][dp] dy words and [CI][xp] x words, then slack for the loads of taps
    // past KW (their sums are dropped), then the staged offset of each pixel of a band
    // (zero past the band: its dy is zero).
    const int stage_words = CO * m.dp + CI * m.xp, slack = SW + 8;
    const int band_px = m.bh * OW, table = ((band_px + 7) & ~7) + 16;
    int* off_tab = reinterpret_cast<int*>(wgrad_mma_stage + 2 * stage_words + slack);
    // With `bias_part`, the block also sums dy over its units for the output channels
    // ≡ blockIdx.y (mod gridDim.y) (the bias gradient; see wgrad_mma_bias_rows).
    float* bias_acc = reinterpret_cast<float*>(off_tab + table);
    const bool bias = bias_part != nullptr;
    for (int i = tid; i < CO; i += blockDim.x) bias_acc[i] = 0.f;
    for (int i = tid * 4; i < 2 * stage_words; i += blockDim.x * 4)
        *reinterpret_cast<uint4*>(wgrad_mma_stage + i) = make_uint4(0u, 0u, 0u, 0u);
    if (tid < slack) wgrad_mma_stage[2 * stage_words + tid] = 0u;
    for (int p = tid; p < table; p += blockDim.x) {
        const int r = p / OW;
        off_tab[p] = p < band_px ? r * (int)g.sh * m.xw + (p - r * OW) * (int)g.sw : 0;
    }
    float acc[MT][SW][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int k = 0; k < SW; ++k)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][k][j] = 0.f;

    const int bands = (OH + m.bh - 1) / m.bh;
    const u64 units = g.n * (u64)bands;
    const int gq = lane >> 2, tq = lane & 3;
    // ldmatrix rows: matrices 0/1 are channels 0–7/8–15 at pixels 0–3, 2/3 the same at 4–7.
    const int a_word = ((lane & 7) + ((lane >> 3) & 1) * 8) * m.dp + (lane >> 4) * 4;
    const int b_word = CO * m.dp + (gw * 8 + gq) * m.xp + kh * (int)g.dh * m.xw + m.col0 - (int)g.pw;
    const u32 stage0 = smem_u32(wgrad_mma_stage);
    __syncthreads();  // zeros before the copies
    // Starts the copies of unit `v` into buffer `b` (0 or 1).
    auto issue = [&](u64 v, int b) {
        const WgradUnit w(v, bands, m.bh, OH);
        const u32 base = stage0 + (WIDE ? (stage_words + b * (stage_words / 2)) : b * stage_words) * 4;
        wgrad_mma_issue<T, CO>(x, dy, base, base + CO * m.dp * (int)sizeof(T), g, c_out, co0, ci0, CI, w, m);
    };
    if (blockIdx.x < units) issue(blockIdx.x, 0);
    cp_async_commit();
    int it = 0;
    for (u64 u = blockIdx.x; u < units; u += gridDim.x, ++it) {
        const int cur_word = WIDE ? 0 : (it & 1) * stage_words;
        const u64 next = u + gridDim.x;
        if (next < units) issue(next, (it + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // every thread's copies of this unit have landed
        const WgradUnit w(u, bands, m.bh, OH);
        if constexpr (WIDE) {
            wgrad_mma_widen<T>(wgrad_mma_stage, wgrad_mma_stage + stage_words + (it & 1) * (stage_words / 2),
                               stage_words);
            __syncthreads();
            // The bias pass only reads the stage, as the MMAs do: no barrier between them.
            if (bias) wgrad_mma_bias_rows(wgrad_mma_stage, CO, m.dp, (w.here * OW + 7) & ~7, bias_acc);
        } else {
            if (bias) {
                wgrad_mma_bias_rows(wgrad_mma_stage + cur_word, CO, m.dp, (w.here * OW + 7) & ~7, bias_acc);
                __syncthreads();  // the raw rows are read before the rounding pass
            }
            wgrad_mma_round(wgrad_mma_stage + cur_word, stage_words);
            __syncthreads();
        }
        const int steps = (w.here * OW + 7) >> 3;
        const u32* xs_lane = wgrad_mma_stage + cur_word + b_word;
        u32 a_addr = stage0 + (cur_word + a_word) * 4;
        const int* ot = off_tab + tq;
        u32 b0[SW][2], b1[SW][2];
#pragma unroll
        for (int k = 0; k < SW; ++k) {
            b0[k][0] = xs_lane[ot[0] + k];
            b0[k][1] = xs_lane[ot[4] + k];
        }
        int s = 0;
        for (; s + 2 <= steps; s += 2) {
            wgrad_mma_step<MT, SW>(acc, a_addr, m.dp, b0, b1, xs_lane, ot + 8 * s + 8);
            wgrad_mma_step<MT, SW>(acc, a_addr + 32, m.dp, b1, b0, xs_lane, ot + 8 * s + 16);
            a_addr += 64;
        }
        if (s < steps) wgrad_mma_step<MT, SW>(acc, a_addr, m.dp, b0, b1, xs_lane, ot + 8 * s + 8);
        __syncthreads();  // this stage is refilled next iteration
    }
    cp_async_wait<0>();
    if (bias) {
        __syncthreads();
        for (int i = tid; i < CO; i += blockDim.x)
            if (i % (int)gridDim.y == (int)blockIdx.y)
                bias_part[((u64)blockIdx.x * gridDim.z + blockIdx.z) * CO + i] = bias_acc[i];
    }
    // The block's sums in fragment order (see WgradFrag).
    const u64 blk = (u64)blockIdx.z * gridDim.y + blockIdx.y;
    const u64 per_block = (u64)warps * MT * SW * 128;
    float* out = partial + ((u64)blockIdx.x * gridDim.y * gridDim.z + blk) * per_block +
                 (u64)warp * MT * SW * 128 + lane * 4;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int k = 0; k < SW; ++k)
            *reinterpret_cast<float4*>(out + (i * SW + k) * 128) =
                make_float4(acc[i][k][0], acc[i][k][1], acc[i][k][2], acc[i][k][3]);
}

// dw = Σ over the `parts` blocks along x, in order, of their sums (fragment order, `frags`
// floats a part), mapped onto [c_out][c][kh][kw]. A block of 256 threads takes
// WGRAD_SUM_COLS float4 columns; its WGRAD_SUM_GROUPS thread groups sum the parts ≡ 0, 1, …
// (mod groups), four loads in flight a thread, and the first group adds the groups' sums in
// order (deterministic). H200, the 66 parts of b256 32→64 14² 5×5 (13.5 MB), back to back
// after the kernel (bench/tools/conv_wgrad/sum_sweep.sh): 64 columns × 4 groups 6.0–6.1 µs,
// 32 × 8 5.4–5.6, 16 × 16 5.4–5.6, 8 × 32 7.4–7.6: about 2.4 TB/s from the L2.
#ifndef WGRAD_SUM_COLS
#define WGRAD_SUM_COLS 32
#endif
#define WGRAD_SUM_GROUPS (256 / WGRAD_SUM_COLS)

__device__ __forceinline__ float4& operator+=(float4& a, const float4 b) {
    a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
    return a;
}

// Σ over p ≡ grp (mod WGRAD_SUM_GROUPS), p < parts, of src[p · step], in order.
template <typename V>
__device__ __forceinline__ void wgrad_sum_parts(V& acc, const V* __restrict__ src, u64 step, u64 parts, u64 grp) {
    constexpr u64 G = WGRAD_SUM_GROUPS;
    u64 p = grp;
    for (; p + 3 * G < parts; p += 4 * G) {
        V v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = src[(p + j * G) * step];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc += v[j];
    }
    for (; p < parts; p += G) acc += src[p * step];
}

// With a bias, the blocks past the fragments' sum the bias partials ([parts][bias_cols])
// the same way into bias_out (c_out values).
template <typename T>
__device__ void conv_wgrad_mma_bias_sum(const float* __restrict__ bias_part, T* __restrict__ bias_out,
                                        u64 bias_cols, u64 parts, u64 c_out, u64 block) {
    __shared__ float sums[WGRAD_SUM_GROUPS][WGRAD_SUM_COLS];
    const int col = threadIdx.x % WGRAD_SUM_COLS, grp = threadIdx.x / WGRAD_SUM_COLS;
    const u64 c = block * WGRAD_SUM_COLS + col;
    float acc = 0.f;
    if (c < bias_cols) wgrad_sum_parts(acc, bias_part + c, bias_cols, parts, grp);
    sums[grp][col] = acc;
    __syncthreads();
    if (grp != 0 || c >= c_out) return;
    for (int g = 1; g < WGRAD_SUM_GROUPS; ++g) acc += sums[g][col];
    bias_out[c] = from_c<T>(acc);
}

template <typename T>
__device__ void conv_wgrad_mma_sum_impl(const float* __restrict__ partial, T* __restrict__ dw, u64 frags,
                                        u64 parts, WgradFrag f, const float* __restrict__ bias_part,
                                        T* __restrict__ bias_out, u64 bias_cols) {
    const u64 frag_blocks = (frags / 4 + WGRAD_SUM_COLS - 1) / WGRAD_SUM_COLS;
    if (blockIdx.x >= frag_blocks) {
        conv_wgrad_mma_bias_sum(bias_part, bias_out, bias_cols, parts, f.c_out, blockIdx.x - frag_blocks);
        return;
    }
    __shared__ float4 sums[WGRAD_SUM_GROUPS][WGRAD_SUM_COLS];
    const int col = threadIdx.x % WGRAD_SUM_COLS, grp = threadIdx.x / WGRAD_SUM_COLS;
    const u64 e4 = (u64)blockIdx.x * WGRAD_SUM_COLS + col;
    const u64 step = frags / 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (e4 < step) wgrad_sum_parts(acc, reinterpret_cast<const float4*>(partial) + e4, step, parts, grp);
    sums[grp][col] = acc;
    __syncthreads();
    if (grp != 0 || e4 >= step) return;
    for (int g = 1; g < WGRAD_SUM_GROUPS; ++g) acc += sums[g][col];
    u64 rest = e4;
    const int lane = (int)(rest % 32); rest /= 32;
    const int k = (int)(rest % f.sw); rest /= f.sw;
    const int i = (int)(rest % f.mt); rest /= f.mt;
    const int warp = (int)(rest % f.warps); rest /= f.warps;
    const u64 by = rest % f.grid_y, bz = rest / f.grid_y;
    if (k >= f.kw_n) return;
    const int kh = warp % f.kh_n, gw = warp / f.kh_n, gq = lane >> 2, tq = lane & 3;
    const int ci_block = 8 * (f.warps / f.kh_n);
    const float v[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u64 co = bz * 16 * f.mt + 16 * i + gq + 8 * (j >> 1);
        const u64 ci = by * ci_block + gw * 8 + 2 * tq + (j & 1);
        if (co < f.c_out && ci < f.c) dw[((co * f.c + ci) * f.kh_n + kh) * f.kw_n + k] = from_c<T>(v[j]);
    }
}

// Per dtype (each module compiles its own line): f32 rounded to TF32; bf16 and f16 widened
// (exact). The partials are f32 in every case; the sum writes the gradients in the dtype.
#define CONV_WGRAD_MMA(T, NAME, MT, SW)                                                                       \
    extern "C" __global__ void __launch_bounds__(WGRAD_MMA_THREADS, WGRAD_MMA_BLOCKS)                          \
        conv_wgrad_mma##MT##x##SW##_##NAME(const T* x, const T* dy, float* partial, float* bias_part, Win g,  \
                                           u64 c_out, WgradMma m) {                                           \
        conv_wgrad_mma_impl<T, MT, SW>(x, dy, partial, bias_part, g, c_out, m);                               \
    }
#define CONV_WGRAD_MMA_FOR(T, NAME)                                                                           \
    CONV_WGRAD_MMA(T, NAME, 4, 3)                                                                             \
    CONV_WGRAD_MMA(T, NAME, 4, 5)                                                                             \
    CONV_WGRAD_MMA(T, NAME, 4, 7)                                                                             \
    CONV_WGRAD_MMA(T, NAME, 2, 3)                                                                             \
    CONV_WGRAD_MMA(T, NAME, 2, 5)                                                                             \
    CONV_WGRAD_MMA(T, NAME, 2, 7)                                                                             \
    extern "C" __global__ void conv_wgrad_mma_sum_##NAME(const float* partial, T* dw, u64 frags, u64 parts,  \
                                                         WgradFrag f, const float* bias_part, T* bias_out,   \
                                                         u64 bias_cols) {                                     \
        conv_wgrad_mma_sum_impl<T>(partial, dw, frags, parts, f, bias_part, bias_out, bias_cols);             \
    }
CONV_WGRAD_MMA_FOR(f16, f16)
CONV_WGRAD_MMA_FOR(bf16, bf16)
CONV_WGRAD_MMA_FOR(float, f32)
