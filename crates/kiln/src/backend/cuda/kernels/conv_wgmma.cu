// The same convolutions (stride 1, at most 64 input channels) on Hopper's warpgroup MMA
// (`wgmma.mma_async`, sm_90a): a block computes 64 output channels × 256 pixels of a band of
// output rows, split among WGS warpgroups (2 or 4) of 256 / WGS pixels each, with one
// instruction per warpgroup, tap and 32 bytes of channels. Several warpgroups rather than one
// with all 256 pixels: staging the band and writing the outputs are most of a block's
// instructions, and they want many threads (one warpgroup per block measured 42 µs for the
// b256 32→64 14² 5×5 bf16 forward on an H200, tensor pipe active 21% of the time).
//
// GEMM view with the roles of conv_mma.cu swapped: M = output channels (the filter, A),
// N = pixels (the staged band, B), K = (tap, channel). Both operands are read by the tensor
// cores straight from shared memory through descriptors, in the "K-major, no swizzle"
// layout: 16-byte rows (8 bf16 or 4 TF32 channels) grouped in 8-row core matrices of 128
// contiguous bytes. The band is staged chunk-major ([channel chunk][pixel][16 bytes]), so
// consecutive pixels are 16 bytes apart and a tap's B operand is the band shifted by the
// tap's offset. That needs one stride along N: the pixels of a band row are computed for
// the whole staged width BW (output columns OW..BW-1 are computed and dropped), so pixel n
// of the block is band pixel n + tap offset for every n. rows × BW ≤ 256.
//
// The filter is prepared as [tap][co tile][chunk][64 co][16 bytes] (`conv_wg_weights`), so
// a tap's A operand is one contiguous run, copied by cp.async into one of WG_STAGES slots
// while the previous group of taps computes.
//
// Without sm_90a (other GPUs) the kernels compile to nothing; the host only launches them
// on compute capability 9.0.

#define WG_STAGES 2

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_D16(o)                                                                                      \
    "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]),    \
        "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]),             \
        "+f"(d[o + 11]), "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), "+f"(d[o + 15])
#define WG_REGS32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32 WG_D16(0), WG_D16(16)
#define WG_REGS64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_D64 WG_D16(0), WG_D16(16), WG_D16(32), WG_D16(48)

// D[64 × N] += A[64 × k] · B[k × N] for one 32-byte step of channels (k16 for 16-bit types,
// k8 for TF32), both operands K-major in shared memory (scale-d is the predicate p, always
// set: the accumulators start at zero).
template <typename T, int N> struct Wg;
template <> struct Wg<bf16, 64> {
    __device__ __forceinline__ static void mma(float* d, u64 da, u64 db) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32 ", %32, %33, p, 1, 1, 0, 0; }"
                     : WG_D32
                     : "l"(da), "l"(db), "n"(1));
    }
};
template <> struct Wg<bf16, 128> {
    __device__ __forceinline__ static void mma(float* d, u64 da, u64 db) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64 ", %64, %65, p, 1, 1, 0, 0; }"
                     : WG_D64
                     : "l"(da), "l"(db), "n"(1));
    }
};
template <> struct Wg<f16, 64> {
    __device__ __forceinline__ static void mma(float* d, u64 da, u64 db) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WG_REGS32 ", %32, %33, p, 1, 1, 0, 0; }"
                     : WG_D32
                     : "l"(da), "l"(db), "n"(1));
    }
};
template <> struct Wg<f16, 128> {
    __device__ __forceinline__ static void mma(float* d, u64 da, u64 db) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_REGS64 ", %64, %65, p, 1, 1, 0, 0; }"
                     : WG_D64
                     : "l"(da), "l"(db), "n"(1));
    }
};
template <> struct Wg<float, 64> {
    __device__ __forceinline__ static void mma(float* d, u64 da, u64 db) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " WG_REGS32 ", %32, %33, p, 1, 1; }"
                     : WG_D32
                     : "l"(da), "l"(db), "n"(1));
    }
};
template <> struct Wg<float, 128> {
    __device__ __forceinline__ static void mma(float* d, u64 da, u64 db) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " WG_REGS64 ", %64, %65, p, 1, 1; }"
                     : WG_D64
                     : "l"(da), "l"(db), "n"(1));
    }
};

// A shared-memory matrix descriptor without swizzle: start address, the byte offset between
// the two 16-byte columns of a K step (LBO) and between 8-row groups (SBO).
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}
#endif

// wp[tap][tile][chunk][co 64][e] from the packed filter w (chunk·E + e = input channel,
// E = 16 bytes of elements), zeros beyond c_out and cin, TF32-rounded for f32; `flip` as in
// conv_mma_weights. One block per (tap, co) row over co_pad = tiles·64, threads over the
// row's cin_k channels.
template <typename T>
__device__ void conv_wg_weights_impl(const T* w, typename Mma<T>::S* wp, u64 c_out, u64 cin, u64 taps, u64 cin_k,
                                     u64 co_pad, int flip) {
    constexpr u64 E = 16 / sizeof(typename Mma<T>::S);
    const u64 r = blockIdx.x, co = r % co_pad, tap = r / co_pad;
    const u64 tile = co / 64, ci_row = co % 64, chunks = cin_k / E;
    typename Mma<T>::S* dst = wp + ((tap * (co_pad / 64) + tile) * chunks) * 64 * E + ci_row * E;
    for (u64 ci = threadIdx.x; ci < cin_k; ci += blockDim.x) {
        T v = from_c<T>(0);
        if (co < c_out && ci < cin)
            v = flip ? w[(ci * c_out + co) * taps + (taps - 1 - tap)] : w[(co * cin + ci) * taps + tap];
        dst[(ci / E) * 64 * E + ci % E] = Mma<T>::stage(v);
    }
}

// The forward convolution, stride 1 (padding and dilation any; one group). Block (x = image ×
// band, y = channel tile of 64) of WGS warpgroups computes output rows [band·rows, +rows) of
// one image; warpgroup w the block's pixels [w·N, +N), N = 256 / WGS. `chunks`: 16-byte channel chunks staged per pixel (even: a K step is two);
// `pix`: the staged band's pixel count (≥ every tap's 256-pixel window); `tps` taps share a
// weight slot. Dynamic shared memory: (chunks·pix + WG_STAGES·tps·chunks·64)·16 bytes.
template <typename T, int WGS>
__device__ void conv_wg_impl(const T* x, const typename Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias,
                             int relu, int rows, int chunks, int pix, int tps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef typename Mma<T>::S S;
    constexpr int ESZ = (int)sizeof(S), E = 16 / ESZ, N = 256 / WGS, NACC = N / 2;
    extern __shared__ __align__(128) unsigned char conv_wg_smem[];
    const int H = (int)g.h, W = (int)g.w, OH = (int)g.oh, OW = (int)g.ow;
    const int KH = (int)g.kh, KW = (int)g.kw, PH = (int)g.ph, PW = (int)g.pw, DH = (int)g.dh, DW = (int)g.dw;
    const int taps = KH * KW, cin = (int)g.c;
    const int BW = OW + (KW - 1) * DW, BH = rows + (KH - 1) * DH;
    unsigned char* xs = conv_wg_smem;
    unsigned char* ws = xs + chunks * pix * 16;
    const u32 xs_addr = smem_u32(xs), ws_addr = smem_u32(ws);

    const int bands = (OH + rows - 1) / rows;
    const u64 b = blockIdx.x / bands;
    const int oh0 = (int)(blockIdx.x % bands) * rows;
    const int nrows = min(rows, OH - oh0);
    const u64 tile = blockIdx.y, tiles = gridDim.y;
    const u32 tap_bytes = chunks * 64 * 16;

    // Group q of the filter: taps [q·tps, +tps) of this channel tile into slot [tap][...].
    const int groups = (taps + tps - 1) / tps;
    auto load_group = [&](int q, int slot) {
        const int t0 = q * tps, count = min(tps, taps - t0);
        const u32 units = tap_bytes / 16;
        for (int t = 0; t < count; ++t) {
            const char* src = reinterpret_cast<const char*>(wp) + ((u64)(t0 + t) * tiles + tile) * tap_bytes;
            const u32 dst = ws_addr + (slot * tps + t) * tap_bytes;
            for (u32 i = threadIdx.x; i < units; i += blockDim.x) cp_async16(dst + i * 16, src + i * 16);
        }
    };
#pragma unroll
    for (int q = 0; q < WG_STAGES - 1; ++q) {
        if (q < groups) load_group(q, q);
        cp_async_commit();
    }

    // The band, chunk-major: item (chunk pair, pixel) loads 32 bytes of channels of one
    // pixel and stores them as the pixel's rows of two chunks. Pixels past the band (up to
    // `pix`) are zeros: only dropped outputs read them.
    {
        constexpr int G = 2 * E;
        const T* xb = x + g.offset + b * g.s[0];
        const int iy0 = oh0 - PH;
        const i64 s1 = (i64)g.s[1], s2 = (i64)g.s[2], s3 = (i64)g.s[3];
        const int real = BH * BW, items = pix * (chunks / 2);
        for (int it = threadIdx.x; it < items; it += blockDim.x) {
            const int pair = (u32)it / (u32)pix, px = it - pair * pix;
            const int yy = (u32)px / (u32)BW, xx = px - yy * BW;
            const int iy = iy0 + yy, ix = xx - PW, c0 = pair * G;
            const bool in = px < real && iy >= 0 && iy < H && ix >= 0 && ix < W;
            S v[G];
            const T* p = xb + (i64)iy * s2 + (i64)ix * s3 + c0 * s1;
#pragma unroll
            for (int u = 0; u < G; ++u) v[u] = in && c0 + u < cin ? Mma<T>::stage(p[u * s1]) : (S)0;
            u32 word[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if constexpr (sizeof(S) == 2)
                    word[k] = (u32)v[2 * k] | ((u32)v[2 * k + 1] << 16);
                else
                    word[k] = (u32)v[k];
            }
            uint4* lo = reinterpret_cast<uint4*>(xs + ((2 * pair) * pix + px) * 16);
            uint4* hi = reinterpret_cast<uint4*>(xs + ((2 * pair + 1) * pix + px) * 16);
            *lo = make_uint4(word[0], word[1], word[2], word[3]);
            *hi = make_uint4(word[4], word[5], word[6], word[7]);
        }
    }

    float d[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) d[i] = 0.f;

    const int ksteps = chunks / 2, n_base = (threadIdx.x >> 7) * N;
    const u32 b_lbo = pix * 16;
    int r = 0, s = 0;  // the filter row and column of the next tap
    for (int q = 0; q < groups; ++q) {
        cp_async_wait<WG_STAGES - 2>();
        // This thread's shared-memory writes (the band, the group's copies) become visible to
        // the tensor cores' reads (the async proxy), then to every thread's.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (q + WG_STAGES - 1 < groups) load_group(q + WG_STAGES - 1, (q + WG_STAGES - 1) % WG_STAGES);
        cp_async_commit();
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        const int count = min(tps, taps - q * tps);
        const u32 a_slot = ws_addr + (q % WG_STAGES) * tps * tap_bytes;
#pragma unroll 1
        for (int t = 0; t < count; ++t) {
            const u32 a_tap = a_slot + t * tap_bytes;
            const u32 b_tap = xs_addr + (u32)((r * DH * BW + s * DW + n_base) * 16);
            if (++s == KW) s = 0, ++r;
#pragma unroll 1
            for (int kc = 0; kc < ksteps; ++kc) {
                const u64 da = wg_desc(a_tap + kc * 2 * 1024, 1024, 128);
                const u64 db = wg_desc(b_tap + kc * 2 * b_lbo, b_lbo, 128);
                Wg<T, N>::mma(d, da, db);
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        // The slot is overwritten by the copies issued after the next barrier.
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    cp_async_wait<0>();

    // Accumulator 4j + q: output channel 16·warp + gq (+8 for q ≥ 2), pixel n_base + 8j + 2tq
    // (+1 for odd q), warp counted within the warpgroup; pixel n is band row n / BW, column
    // n % BW, kept where the column is < OW.
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    const u64 plane = (u64)OH * OW;
    const u64 co_a = tile * 64 + 16 * warp + gq, co_b = co_a + 8;
    const float bias_a = bias && co_a < c_out ? (float)to_c(bias[co_a]) : 0.f;
    const float bias_b = bias && co_b < c_out ? (float)to_c(bias[co_b]) : 0.f;
    T* y_a = y + (b * c_out + co_a) * plane + (u64)oh0 * OW;
    T* y_b = y_a + 8 * plane;
    const bool keep_a = co_a < c_out, keep_b = co_b < c_out;
    auto put = [&](T* p, float v, float bv) {
        v += bv;
        if (relu) v = v <= 0.f ? 0.f : v;  // NaN passes, as in add_relu
        *p = from_c<T>(v);
    };
    int row = (n_base + 2 * tq) / BW, col = n_base + 2 * tq - row * BW;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            int rr = row, cc = col + e;
            if (cc >= BW) cc -= BW, ++rr;
            if (rr < nrows && cc < OW) {
                const int off = rr * OW + cc;
                if (keep_a) put(y_a + off, d[4 * j + e], bias_a);
                if (keep_b) put(y_b + off, d[4 * j + 2 + e], bias_b);
            }
        }
        col += 8;
        while (col >= BW) col -= BW, ++row;
    }
#endif
}

#define CONV_WG_FOR(T, NAME)                                                                           \
    extern "C" __global__ void conv_wg_weights_##NAME(const T* w, Mma<T>::S* wp, u64 c_out, u64 cin,    \
                                                      u64 taps, u64 cin_k, u64 co_pad, int flip) {      \
        conv_wg_weights_impl<T>(w, wp, c_out, cin, taps, cin_k, co_pad, flip);                           \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 2) conv_wg2_##NAME(                                 \
        const T* x, const Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int rows,     \
        int chunks, int pix, int tps) {                                                                \
        conv_wg_impl<T, 2>(x, wp, y, g, c_out, bias, relu, rows, chunks, pix, tps);                    \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(512, 2) conv_wg4_##NAME(                                 \
        const T* x, const Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int rows,     \
        int chunks, int pix, int tps) {                                                                \
        conv_wg_impl<T, 4>(x, wp, y, g, c_out, bias, relu, rows, chunks, pix, tps);                    \
    }

CONV_WG_FOR(f16, f16)
CONV_WG_FOR(bf16, bf16)
CONV_WG_FOR(float, f32)
