// An experiment, not part of kiln (bench/tools/conv_wgp/README.md has its measurements):
// the persistent, warp-specialised form of conv_mma.cu's warpgroup kernel (sm_90a): the same
// implicit GEMM (a tile of consecutive output pixels against 8·WN output channels, the input
// band staged channel-innermost, a tap's A operand the band shifted by the tap's offset), but
// a block owns several tiles and overlaps one tile's staging and stores with another's MMAs.
//
// A block is three warpgroups:
// - warpgroup 0 produces: its warp 0 streams the filter, one tap a slot, by bulk copies
//   (cp.async.bulk, completing on the slot's `full` barrier) into a ring of `slots` slots,
//   refilling a slot once its consumer has released it; warps 1-3 stage the next tile's band
//   into the band buffer its consumer has released. It gives its registers up (setmaxnreg).
// - warpgroups 1 and 2 consume alternate tiles (the block's tiles k = 0, 2, … and 1, 3, …),
//   each tile m64 × WM pixels by wgmma, A fragments by ldmatrix from the band, B from the
//   weight slot. The filter streams once per tile in tap order, so the second consumer's
//   MMAs follow the first's through the ring and its stores overlap the other's MMAs.
// The first tile's band is staged by the whole block before the roles split.
//
// Precision and outputs as conv_mma_impl: TF32 (cvt.rna) or exact 16-bit products into f32,
// bias and ReLU applied once, stores straight from the accumulators.

#define WGP_MAX_SLOTS 24
// Registers a thread of the producer warpgroup keeps (two consumers, three); the consumers
// share the rest of the launch's 65536 (multiples of 8).
#ifndef WGP_PRODUCER_REGS
#define WGP_PRODUCER_REGS 88
#endif
#ifndef WGP_PRODUCER_REGS3
#define WGP_PRODUCER_REGS3 72
#endif
// The first tiles' bands the whole block stages before the roles split (at most C).
#ifndef WGP_PROLOGUE_TILES
#define WGP_PROLOGUE_TILES 1
#endif
#define WGP_CONSUMER_REGS (((384 * 168 - 128 * WGP_PRODUCER_REGS) / 256) & ~7)
#define WGP_CONSUMER_REGS3 (((512 * 128 - 128 * WGP_PRODUCER_REGS3) / 384) & ~7)

// WGP_TRACE (harness builds only): clock64 stamps of each block's phases into wgp_trace.
#if defined(WGP_TRACE)
#define WGP_TRACE_SLOTS 24
__device__ long long wgp_trace[1024 * WGP_TRACE_SLOTS];
#define WGP_STAMP(i) (wgp_trace[blockIdx.x * WGP_TRACE_SLOTS + (i)] = clock64())
#define WGP_ADD(i, v) (wgp_trace[blockIdx.x * WGP_TRACE_SLOTS + (i)] += (v))
#else
#define WGP_STAMP(i) ((void)0)
#define WGP_ADD(i, v) ((void)0)
#endif

#if defined(KILN_WGMMA)

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Waits until the barrier's phase of this parity has completed, suspended (up to
// WGP_WAIT_HINT ns a try) rather than spinning: a consumer waiting out the other's tile
// must not take issue slots from it.
#ifndef WGP_WAIT_HINT
#define WGP_WAIT_HINT 1000000
#endif
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
#if WGP_WAIT_HINT > 0
    asm volatile(
        "{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2; @!p bra WAIT; }" ::"r"(bar),
        "r"(parity), "n"(WGP_WAIT_HINT)
        : "memory");
#else
    asm volatile(
        "{ .reg .pred p; WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra WAIT; }" ::"r"(bar),
        "r"(parity)
        : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
template <int N> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

// Tile `tile` of P consecutive output pixels: it starts at pixel p0 of image b0, holds npx
// pixels over nimg images, and its band is BH staged rows, the first image's rows0 of them.
struct WgpTile {
    u64 b0;
    u32 p0, npx, nimg;
    int oh_first, rows0, BH;
};
__device__ __forceinline__ WgpTile wgp_tile(u32 tile, u32 P, const Win& g) {
    const int OH = (int)g.oh, OW = (int)g.ow, SH = (int)g.sh;
    const int span_h = ((int)g.kh - 1) * (int)g.dh + 1, rows_full = (OH - 1) * SH + span_h;
    const u32 plane = (u32)OH * (u32)OW;
    const u64 m0 = (u64)tile * P;
    WgpTile t;
    t.b0 = m0 / plane;
    t.p0 = (u32)(m0 - t.b0 * plane);
    t.npx = (u32)min((u64)P, g.n * plane - m0);
    const u32 last = t.p0 + t.npx - 1;
    t.nimg = last / plane + 1;
    t.oh_first = (int)(t.p0 / (u32)OW);
    const int oh_last = (int)((last - (t.nimg - 1) * plane) / (u32)OW);
    t.rows0 = ((t.nimg == 1 ? oh_last : OH - 1) - t.oh_first) * SH + span_h;
    t.BH = t.nimg == 1 ? t.rows0 : t.rows0 + (int)(t.nimg - 2) * rows_full + oh_last * SH + span_h;
    return t;
}

// Band pixels [from, to) of tile t into xs, by threads tid of nthreads (conv_mma.cu's
// stage_band).
template <typename T>
__device__ void wgp_stage(const T* x, const Win& g, const WgpTile& t, typename Mma<T>::S* xs, int RS, int pitch,
                          int cin_k, int from, int to, int tid, int nthreads) {
    const int OW = (int)g.ow, BW = (OW - 1) * (int)g.sw + ((int)g.kw - 1) * (int)g.dw + 1;
    const int rows_full = ((int)g.oh - 1) * (int)g.sh + ((int)g.kh - 1) * (int)g.dh + 1;
    stage_band(x + g.offset + t.b0 * g.s[0], g, xs, RS, pitch, cin_k, BW, t.oh_first * (int)g.sh - (int)g.ph, t.rows0,
               rows_full, from, min(to, t.BH * BW), tid, nthreads);
}

// The kernel. WM: m64 tiles of pixels per consumer tile (P = 64·WM pixels); KB: k-steps per
// batch of MMAs (dividing a tap's cin_k·size/32 steps). Dynamic shared memory: two band
// buffers of `band_elems` elements (a multiple of 128 bytes), then `slots` weight slots of
// one tap (8·WN·cin_k elements), after the base is aligned to 128 bytes.
template <typename T, int WN, int WM, int KB, int C>
__device__ void conv_wgp_impl(const T* x, typename Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu,
                              int cin_k, int pitch, int band_elems, int slots, const T* w_raw, int flip, u32* meet,
                              u64 wait_ns) {
    typedef typename Mma<T>::S S;
    constexpr int ESZ = sizeof(S), NT = 8 * WN, P = 64 * WM;
    __shared__ __align__(8) u64 bars[2 * C + 2 * WGP_MAX_SLOTS];
    extern __shared__ __align__(16) unsigned char conv_mma_smem[];
    S* base = reinterpret_cast<S*>((reinterpret_cast<u64>(conv_mma_smem) + 127) & ~(u64)127);
    const int OW = (int)g.ow, KW = (int)g.kw, SW = (int)g.sw, DH = (int)g.dh, DW = (int)g.dw;
    const int taps = (int)g.kh * KW;
    const int BW = (OW - 1) * SW + (KW - 1) * DW + 1;
    const int RS = BW * pitch + conv_mma_row_pad(BW, OW, SW, pitch * ESZ / 16) * (16 / ESZ);
    const u32 plane = (u32)g.oh * (u32)OW;
    const u32 ntiles = (u32)((g.n * plane + P - 1) / P);
    // This block's tiles: blockIdx.x + k·gridDim.x.
    const int nlocal = (int)((ntiles - blockIdx.x + gridDim.x - 1) / gridDim.x);
    const u32 tap_elems = NT * cin_k, tap_bytes = tap_elems * ESZ;
    S* ws = base + C * band_elems;
    const u64 co0 = (u64)blockIdx.y * NT;
    const u32 co_pad = gridDim.y * NT, chunks = cin_k * ESZ / 16;
    // Rounds of C tiles, one a consumer; fill `seq` of the weight ring is tap seq mod taps of
    // round seq / taps, read by every consumer of the round.
    const int rounds = (nlocal + C - 1) / C, total_seq = rounds * taps;
    const u32 bar0 = smem_u32(bars);
    auto band_full = [&](int b) { return bar0 + 8 * b; };
    auto band_empty = [&](int b) { return bar0 + 8 * (C + b); };
    auto w_full = [&](int s) { return bar0 + 8 * (2 * C + s); };
    auto w_empty = [&](int s) { return bar0 + 8 * (2 * C + WGP_MAX_SLOTS + s); };
    // Fill `seq` of the weight ring (one thread).
    auto fill = [&](int seq) {
        const int slot = seq % slots, t = seq % taps;
        const u32 bar = w_full(slot), dst = smem_u32(ws + slot * tap_elems);
        mbar_expect_tx(bar, tap_bytes);
        if (gridDim.y == 1) {
            bulk_copy(dst, wp + (u64)t * tap_elems, tap_bytes, bar);
        } else {
            for (u32 c = 0; c < chunks; ++c)
                bulk_copy(dst + c * NT * 16, wp + (((u64)t * chunks + c) * co_pad + co0) * (16 / ESZ), NT * 16, bar);
        }
    };
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2;
    if (threadIdx.x == 0) {
        for (int b = 0; b < C; ++b) {
            mbar_init(band_full(b), 96);
            mbar_init(band_empty(b), 128);
        }
        for (int s = 0; s < slots; ++s) {
            mbar_init(w_full(s), 1);
            mbar_init(w_empty(s), 4 * C);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        WGP_STAMP(0);
    }
    __syncthreads();
    const int first_fills = min(slots, total_seq);

    // Prologue: the whole block stages the first `staged` tiles' bands (tile 0's with the fused
    // filter preparation in quarters, as conv_mma_impl), thread 0 starts the weight ring.
    const int staged = min(nlocal, WGP_PROLOGUE_TILES < C ? WGP_PROLOGUE_TILES : C);
    {
        const WgpTile t0 = wgp_tile(blockIdx.x, P, g);
        const int items = t0.BH * BW;  // band pixels
        const int nthr = blockDim.x;
        if (meet) {
            const SliceArgs sa{(u32)c_out, (u32)g.c, (u32)taps, (u32)cin_k, co_pad, flip, true};
            const Slice<T> slice = load_slice(w_raw, sa);
            const int quarter = items / (4 * nthr) * nthr;
            wgp_stage(x, g, t0, base, RS, pitch, cin_k, 0, quarter, threadIdx.x, nthr);
            store_slice(w_raw, wp, slice, sa);
            wgp_stage(x, g, t0, base, RS, pitch, cin_k, quarter, 2 * quarter, threadIdx.x, nthr);
            announce_slice(meet);
            wgp_stage(x, g, t0, base, RS, pitch, cin_k, 2 * quarter, 3 * quarter, threadIdx.x, nthr);
            await_slices(w_raw, wp, meet, wait_ns, sa);
            if (threadIdx.x == 0) {
                asm volatile("fence.proxy.async;" ::: "memory");  // the prepared filter, for the bulk copies
                for (int s = 0; s < first_fills; ++s) fill(s);
            }
            wgp_stage(x, g, t0, base, RS, pitch, cin_k, 3 * quarter, items, threadIdx.x, nthr);
        } else {
            if (threadIdx.x == 0)
                for (int s = 0; s < first_fills; ++s) fill(s);
            wgp_stage(x, g, t0, base, RS, pitch, cin_k, 0, items, threadIdx.x, nthr);
        }
        for (int k = 1; k < staged; ++k)
            wgp_stage(x, g, wgp_tile(blockIdx.x + k * gridDim.x, P, g), base + k * band_elems, RS,
                                      pitch, cin_k, 0, 0x7fffffff, threadIdx.x, nthr);
        __syncthreads();
        if (threadIdx.x == 0) WGP_STAMP(1);
    }

    if (wg == 0) {
        if constexpr (C == 2)
            regs_dec<WGP_PRODUCER_REGS>();
        else
            regs_dec<WGP_PRODUCER_REGS3>();
        if (warp == 0) {
            if (lane == 0)
                for (int seq = first_fills; seq < total_seq; ++seq) {
                    mbar_wait(w_empty(seq % slots), (u32)(seq / slots - 1) & 1);
                    fill(seq);
                    if (seq == total_seq - 1) WGP_STAMP(16);
                }
        } else {
            for (int k = 0; k < staged; ++k) mbar_arrive(band_full(k));  // staged above
            for (int k = staged; k < nlocal; ++k) {
                const int b = k % C;
                if (k >= C) mbar_wait(band_empty(b), (u32)(k / C - 1) & 1);
                if (k == staged && threadIdx.x == 32) WGP_STAMP(14);
                const WgpTile t = wgp_tile(blockIdx.x + k * gridDim.x, P, g);
                wgp_stage(x, g, t, base + b * band_elems, RS, pitch, cin_k, 0, 0x7fffffff, threadIdx.x - 32, 96);
                if (k == staged && threadIdx.x == 32) WGP_STAMP(15);
                mbar_arrive(band_full(b));
            }
        }
        return;
    }

    if constexpr (C == 2)
        regs_inc<WGP_CONSUMER_REGS>();
    else
        regs_inc<WGP_CONSUMER_REGS3>();
    const int wip = warp & 3, gq = lane >> 2, tq = lane & 3;
    const int ksteps = cin_k * ESZ / 32, nbt = ksteps / KB, NB = taps * nbt;
    const u32 lbo = NT * 16;
    const u64 desc_hi = ((u64)(lbo >> 4) << 16) | ((u64)(128 >> 4) << 32);
    const u32 row_bytes = (u32)(DH * RS * ESZ), col_bytes = (u32)(DW * pitch * ESZ);
    typedef u32 Frag[KB][WM][4];
    Frag fa, fb;
    float acc[WM][WN][4];
    const int c = wg - 1;
    for (int r = 0; r < rounds; ++r) {
        const int k = r * C + c, seq0 = r * taps;
        if (k >= nlocal) {  // no tile this round: release the round's slots all the same
            for (int tap = 0; tap < taps; ++tap) {
                const int seq = seq0 + tap;
                mbar_wait(w_full(seq % slots), (u32)(seq / slots) & 1);
                if (lane == 0) mbar_arrive(w_empty(seq % slots));
            }
            continue;
        }
        const int b = c;
        const WgpTile t = wgp_tile(blockIdx.x + k * gridDim.x, P, g);
        // A rows: this warp's 16 rows of m64 tile mi are the tile's pixels wip·16·WM + mi·16 + …
        u32 a_row[WM];
        const S* xs = base + b * band_elems;
#pragma unroll
        for (int mi = 0; mi < WM; ++mi) {
            u32 i = wip * 16 * WM + mi * 16 + (lane & 15);
            if (i >= t.npx) i = 0;  // computed, never stored
            const u32 q = t.p0 + i, img = q / plane, pp = q - img * plane;
            const int r = (int)(pp / (u32)OW), c = (int)pp - r * OW;
            const int rows_full = ((int)g.oh - 1) * (int)g.sh + ((int)g.kh - 1) * DH + 1;
            const int row = img == 0 ? (r - t.oh_first) * (int)g.sh : t.rows0 + (int)(img - 1) * rows_full + r * (int)g.sh;
            a_row[mi] = smem_u32(xs + row * RS + c * SW * pitch) + (lane >> 4) * 16;
        }
#pragma unroll
        for (int mi = 0; mi < WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < WN; ++ni)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.f;
        mbar_wait(band_full(b), (u32)r & 1);
        const bool tr = k < 3 && (threadIdx.x & 127) == 0;
        if (tr) WGP_STAMP(2 + 4 * k);
        long long waited = 0;
        // Batch cursors: the tap (its filter row and column) and the part of its k-steps of the
        // next batch to load, and of the next to run.
        int l_part = 0, l_r = 0, l_s = 0;
        auto load_batch = [&](Frag& f) {
            const u32 off = l_r * row_bytes + l_s * col_bytes + l_part * KB * 32;
#pragma unroll
            for (int kk = 0; kk < KB; ++kk)
#pragma unroll
                for (int mi = 0; mi < WM; ++mi) ldsm_x4(f[kk][mi], a_row[mi] + off + kk * 32);
            if (++l_part == nbt) {
                l_part = 0;
                if (++l_s == KW) l_s = 0, ++l_r;
            }
        };
        int m_part = 0, m_tap = 0;
        fence_operands(acc);
        // Batch j: wait for its tap's weights (first part), run it, wait for batch j - 1,
        // release j - 1's slot if that was its tap's last part, load batch j + 1's fragments.
        auto body = [&](int j, const Frag& cur, Frag& nxt) {
            const int seq = seq0 + m_tap, slot = seq % slots;
            if (m_part == 0) {
#if defined(WGP_TRACE)
                const long long w0 = clock64();
                mbar_wait(w_full(slot), (u32)(seq / slots) & 1);
                waited += clock64() - w0;
#else
                mbar_wait(w_full(slot), (u32)(seq / slots) & 1);
#endif
            }
            const u64 desc = desc_hi | (u64)((smem_u32(ws + slot * tap_elems) & 0x3FFFF) >> 4);
            const int st0 = m_part * KB;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < KB; ++kk)
#pragma unroll
                for (int mi = 0; mi < WM; ++mi)
                    wg_mma<T, WN>(&acc[mi][0][0], cur[kk][mi], desc + (u64)((st0 + kk) * (2 * lbo >> 4)));
            wg_commit();
            wg_wait<1>();
            // Batch j - 1 is complete: its tap's slot is free if j - 1 was the tap's last part
            // (the tap before this one when this batch is a first part).
            if (j > 0 && m_part == 0 && lane == 0) mbar_arrive(w_empty((seq - 1) % slots));
            if (++m_part == nbt) m_part = 0, ++m_tap;
            if (j + 1 < NB) load_batch(nxt);
        };
        load_batch(fa);
        for (int j = 0; j < NB; j += 2) {
            body(j, fa, fb);
            if (j + 1 < NB) body(j + 1, fb, fa);
        }
        wg_wait<0>();
        fence_operands(acc);
        if (tr) WGP_STAMP(3 + 4 * k), WGP_ADD(5 + 4 * k, waited);
        if (lane == 0) mbar_arrive(w_empty((seq0 + taps - 1) % slots));
        mbar_arrive(band_empty(b));

        // Stores straight from the accumulators: accumulator q of (mi, ni) is pixel row gq
        // (+8 for q ≥ 2), channel 2·tq + (q & 1).
        const int co_lane = (int)co0 + 2 * tq;
        const bool all_co = co0 + NT <= c_out;
        const int c_out_i = (int)min(c_out, (u64)0x7fffffff);
        T* y_lane = y + (t.b0 * c_out + (u64)co_lane) * plane;
        float bias_of[WN][2];
        conv_bias<T, WN>(bias, co0, tq, c_out, bias_of);
#pragma unroll
        for (int mi = 0; mi < WM; ++mi)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const u32 i = wip * 16 * WM + mi * 16 + gq + half * 8;
                if (i >= t.npx) continue;
                const u32 q = t.p0 + i, img = q / plane, pp = q - img * plane;
                conv_store_row<T, WN>(acc[mi], half, bias_of, relu, y_lane + (u64)img * c_out * plane + pp, plane,
                                      all_co, co_lane, c_out_i);
            }
        if (tr) WGP_STAMP(4 + 4 * k);
    }
}
#endif

#if defined(KILN_WGMMA)
#define WGP_BODY(T, WN, WM, KB, C)                                                                              \
    conv_wgp_impl<T, WN, WM, KB, C>(x, wp, y, g, c_out, bias, relu, cin_k, pitch, band_elems, slots, w_raw, flip, \
                                    meet, wait_ns);
#else
#define WGP_BODY(T, WN, WM, KB, C) __trap();
#endif
// conv_wgp{CH}_{NAME}_m{WM}k{KB}c{C}: 128·(C + 1) threads, one block an SM.
#define CONV_WGP_KERNEL(T, NAME, CH, WN, WM, KB, C)                                                             \
    extern "C" __global__ void __launch_bounds__(128 * (C + 1), 1) conv_wgp##CH##_##NAME##_m##WM##k##KB##c##C( \
        const T* x, Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int cin_k, int pitch,        \
        int band_elems, int slots, const T* w_raw, int flip, u32* meet, u64 wait_ns) {                         \
        WGP_BODY(T, WN, WM, KB, C)                                                                             \
    }
CONV_WGP_KERNEL(float, f32, 64, 8, 3, 2, 2)
CONV_WGP_KERNEL(float, f32, 64, 8, 2, 2, 3)
CONV_WGP_KERNEL(bf16, bf16, 64, 8, 3, 2, 2)
CONV_WGP_KERNEL(bf16, bf16, 64, 8, 2, 2, 3)
