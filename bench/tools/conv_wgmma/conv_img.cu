// An experiment, measured and dropped (2026-11-28): the small-channel convolution on
// Hopper's warpgroup MMA with output channels as the MMA's M and output pixels as its N
// (sm_90a; included after kiln's conv_mma.cu, whose helpers it uses, by img_harness.cu).
// Correct on every harness problem (TF32 and bf16 against f64), but on an H100 the b256
// 32→64 14² 5×5 forward took 0.0543 ms in TF32 and 0.0340 in bf16, against 0.0326 and
// 0.0194 for kiln's conv_wg64 with 12 warps; the 28² 3×3 forward 0.0337 against 0.0150.
// Block phases by %globaltimer (-DIMG_TIMES), 14² TF32: staging 11.1 µs, MMAs 26.9 µs,
// epilogue 14.0 µs (after the epilogue went through shared memory; 21 µs before).
// The MMA phase ran at 42% of the TF32 rate with both operands read from shared memory
// in the no-swizzle layout, which was the point of the design.
//
// The idea: conv_wg* multiply pixels (M, fragments by ldmatrix) by weights (N = the 64
// output channels, read by the tensor cores from shared memory). Each m64n64k8 moves 4 KB
// through shared memory for 32 cycles of tensor work: 128 bytes a cycle, all the SM has.
// Here one wgmma is m64 (channels) × n224 (pixels) × k8: 2 KB of weights and 7 KB of
// pixels for 112 cycles, 82 bytes a cycle.
//
// The catch is the pixels' layout: a descriptor names 8-pixel core matrices at one fixed
// stride, so a tap's pixels must sit at fixed strides in shared memory, which a band with
// its halo columns does not give. So a tile is R output rows padded to OWP columns (a
// multiple of 8; pixel n = r·OWP + c), and the band is staged as COPIES copies, copy j
// holding band columns [j·(SLACK + 1), +OWP) of every band row, with SLACK = OWP − OW: tap
// column s reads copy s / (SLACK + 1) at a shift of at most SLACK, so a row's real pixels
// never leave their row (the padded ones read the next row's and are never stored).
// Layout of a copy: [16-byte chunk of channels][band row][column][16 bytes], a chunk
// BAND_PX = (R + KH − 1)·OWP + SLACK pixels long (the SLACK past the last row is read by
// padded pixels only). The weights come as in conv_wg*: [tap][chunk][co][16 bytes].
//
// A block holds IMG_WGS warpgroups, each one tile (a tile is R rows of one image); they walk
// the taps together, the weights streaming through IMG_STAGES slots. Stride 1, dilation 1,
// at most 64 output channels (one M tile), N = IMG_N pixels a tile.

#define IMG_N 224
#define IMG_WGS 2
#define IMG_STAGES 3
#ifndef IMG_INFLIGHT
#define IMG_INFLIGHT 4
#endif

#define IMG_R112 \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25," \
    "%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49," \
    "%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73," \
    "%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97," \
    "%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111}"
#define IMG_D8(d, i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define IMG_D112(d) \
    IMG_D8(d, 0), \
    IMG_D8(d, 8), \
    IMG_D8(d, 16), \
    IMG_D8(d, 24), \
    IMG_D8(d, 32), \
    IMG_D8(d, 40), \
    IMG_D8(d, 48), \
    IMG_D8(d, 56), \
    IMG_D8(d, 64), \
    IMG_D8(d, 72), \
    IMG_D8(d, 80), \
    IMG_D8(d, 88), \
    IMG_D8(d, 96), \
    IMG_D8(d, 104)

#if defined(KILN_WGMMA)
// D (this warp's 16 channels × 224 pixels) += A (64 channels × 32 bytes of K, by descriptor)
// · B (224 pixels × 32 bytes of K, by descriptor).
template <typename T> __device__ void img_mma(float* d, u64 da, u64 db);
template <> __device__ __forceinline__ void img_mma<float>(float* d, u64 da, u64 db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n224k8.f32.tf32.tf32 "
                 IMG_R112 ", %112, %113, p, 1, 1;}"
                 : IMG_D112(d)
                 : "l"(da), "l"(db));
}
template <> __device__ __forceinline__ void img_mma<bf16>(float* d, u64 da, u64 db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 "
                 IMG_R112 ", %112, %113, p, 1, 1, 0, 0;}"
                 : IMG_D112(d)
                 : "l"(da), "l"(db));
}
template <> __device__ __forceinline__ void img_mma<f16>(float* d, u64 da, u64 db) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n224k16.f32.f16.f16 "
                 IMG_R112 ", %112, %113, p, 1, 1, 0, 0;}"
                 : IMG_D112(d)
                 : "l"(da), "l"(db));
}
template <int N> __device__ __forceinline__ void fence_operands1(float (&acc)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
// A K-major no-swizzle descriptor: start, LBO (the next 16 bytes of K), SBO 128 (the next 8
// rows).
__device__ __forceinline__ u64 img_desc(u32 addr, u32 lbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(128 >> 4) << 32);
}
#endif

// y = conv(x, w) (+ bias, ReLU) for tiles of `rows` output rows padded to `owp` columns,
// `copies` band copies `slack` = owp − OW apart, channels rounded to cin_k, `tps` taps a
// weight slot. Dynamic shared memory: IMG_WGS regions of max(copies·chunks·BAND_PX·16 bytes
// of band, 64·(IMG_N + 8) outputs), 128 of alignment, IMG_STAGES·tps·chunks·64·16 of weights.
#ifdef IMG_TIMES
__device__ u64 img_times[4096][4];
#define IMG_MARK(k) if (threadIdx.x == 0 && blockIdx.x < 4096) img_times[blockIdx.x][k] = global_ns();
#else
#define IMG_MARK(k)
#endif
template <typename T>
__device__ void conv_img_impl(const T* x, const typename Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias,
                              int relu, int rows, int owp, int copies, int slack, int cin_k, int tps) {
    typedef typename Mma<T>::S S;
#if !defined(KILN_WGMMA)
    __trap();
#else
    const int ESZ = (int)sizeof(S);
    const int H = (int)g.h, W = (int)g.w, OH = (int)g.oh, OW = (int)g.ow;
    const int KH = (int)g.kh, KW = (int)g.kw, PH = (int)g.ph, PW = (int)g.pw;
    const int taps = KH * KW, cin = (int)g.c;
    const int chunks = cin_k * ESZ / 16, ksteps = chunks / 2;
    const int band_rows = rows + KH - 1;
    const u32 band_px = (u32)(band_rows * owp + slack);
    const u32 chunk_bytes = band_px * 16, copy_bytes = chunk_bytes * chunks, tile_bytes = copy_bytes * copies;
    // A warpgroup's region: its band copies, later its output tile.
    const u32 region = max(tile_bytes, (u32)(64 * (IMG_N + 8) * sizeof(T)));
    extern __shared__ __align__(16) unsigned char conv_img_smem[];
    const u32 band0 = smem_u32(conv_img_smem);
    unsigned char* slots_p = conv_img_smem + IMG_WGS * region;
    slots_p = reinterpret_cast<unsigned char*>((reinterpret_cast<u64>(slots_p) + 127) & ~(u64)127);
    const u32 slots = smem_u32(slots_p);
    const u32 tap_bytes = chunks * 64 * 16;  // one tap of the weights: [chunk][co][16 bytes]

    IMG_MARK(0)
    const int tiles_per_image = (OH + rows - 1) / rows;
    const u64 tiles = g.n * (u64)tiles_per_image;
    const int wg = threadIdx.x >> 7;

    // Group q of the filter (taps [q·tps, +tps)) into slot `slot`: one contiguous run (one
    // channel tile).
    const int groups = (taps + tps - 1) / tps;
    auto load_group = [&](int q, int slot) {
        const u32 t0 = q * tps, count = min(tps, taps - (int)t0);
        const char* src = reinterpret_cast<const char*>(wp) + (u64)t0 * tap_bytes;
        const u32 dst = slots + slot * tps * tap_bytes;
        for (u32 i = threadIdx.x; i < count * tap_bytes / 16; i += blockDim.x) cp_async16(dst + i * 16, src + i * 16);
    };
    load_group(0, 0);
    cp_async_commit();

    // Staging: item (tile t, chunk pair, band row, band column a), a over every column some
    // copy holds; 32 bytes of channels loaded together, stored to each copy that holds a.
    {
        constexpr int G = 32 / ESZ;
        const int cols = (copies - 1) * (slack + 1) + owp;
        const int per_tile = (chunks / 2) * band_rows * cols;
        const int items = IMG_WGS * per_tile;
        const i64 s0 = (i64)g.s[0], s1 = (i64)g.s[1], s2 = (i64)g.s[2], s3 = (i64)g.s[3];
        auto load = [&](int it, S* v, int& t, int& cp, int& br, int& a) {
            t = it / per_tile;
            const int rem = it - t * per_tile;
            cp = rem / (band_rows * cols);
            const int rc = rem - cp * (band_rows * cols);
            br = rc / cols;
            a = rc - br * cols;
            const u64 tile = (u64)blockIdx.x * IMG_WGS + t;
            const u64 img = tile / tiles_per_image;
            const int r0 = (int)(tile - img * tiles_per_image) * rows;
            const int iy = r0 + br - PH, ix = a - PW, c0 = cp * G;
            const bool in = it < items && tile < tiles && iy >= 0 && iy < H && ix >= 0 && ix < W;
            const T* p = x + g.offset + (i64)img * s0 + (i64)iy * s2 + (i64)ix * s3 + c0 * s1;
#pragma unroll
            for (int u = 0; u < G; ++u) v[u] = in && c0 + u < cin ? Mma<T>::stage(p[u * s1]) : (S)0;
        };
        auto store = [&](int it, const S* v, int t, int cp, int br, int a) {
            if (it >= items) return;
            u32 word[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if constexpr (sizeof(S) == 2)
                    word[k] = (u32)v[2 * k] | ((u32)v[2 * k + 1] << 16);
                else
                    word[k] = (u32)v[k];
            }
            for (int j = 0; j < copies; ++j) {
                const int u = a - j * (slack + 1);
                if (u < 0 || u >= owp) continue;
                const u32 off = t * region + j * copy_bytes + (2 * cp) * chunk_bytes + (br * owp + u) * 16;
                uint4* d0 = reinterpret_cast<uint4*>(conv_img_smem + off);
                uint4* d1 = reinterpret_cast<uint4*>(conv_img_smem + off + chunk_bytes);
                *d0 = make_uint4(word[0], word[1], word[2], word[3]);
                *d1 = make_uint4(word[4], word[5], word[6], word[7]);
            }
        };
        // IMG_INFLIGHT items loaded before any is stored: the loads' latency, not their
        // count, bounds staging.
        for (int it = threadIdx.x; it < items; it += IMG_INFLIGHT * blockDim.x) {
            S v[IMG_INFLIGHT][G];
            int t[IMG_INFLIGHT], cp[IMG_INFLIGHT], br[IMG_INFLIGHT], a[IMG_INFLIGHT];
#pragma unroll
            for (int k = 0; k < IMG_INFLIGHT; ++k) load(it + k * blockDim.x, v[k], t[k], cp[k], br[k], a[k]);
#pragma unroll
            for (int k = 0; k < IMG_INFLIGHT; ++k) store(it + k * blockDim.x, v[k], t[k], cp[k], br[k], a[k]);
        }
    }

    IMG_MARK(1)
    float acc[IMG_N / 2];
#pragma unroll
    for (int i = 0; i < IMG_N / 2; ++i) acc[i] = 0.f;
    fence_operands1(acc);
    const u32 my_band = band0 + wg * region;
    for (int q = 0; q < groups; ++q) {
        cp_async_wait<0>();
        fence_proxy_async();
        // All but the last committed batch (group q − 1's): group q − 2's slot, which the
        // load below overwrites, is free.
        wg_wait<1>();
        __syncthreads();  // this group's weights (and, the first time, the bands) are visible
        if (q + 1 < groups) load_group(q + 1, (q + 1) % IMG_STAGES);
        cp_async_commit();
        const int count = min(tps, taps - q * tps), steps = count * ksteps;
        const u32 slot = slots + (q % IMG_STAGES) * tps * tap_bytes;
        // Step st: tap st / ksteps of the group, 32 bytes of channels st % ksteps.
        auto desc_of = [&](int st, u64& da, u64& db) {
            const int t = st / ksteps, kc = st - t * ksteps;
            const int tap = q * tps + t, r = tap / KW, s = tap - r * KW;
            const int j = s / (slack + 1), sh = s - j * (slack + 1);
            da = img_desc(slot + t * tap_bytes + kc * 2048, 1024);
            db = img_desc(my_band + j * copy_bytes + (r * owp + sh) * 16 + kc * 2 * chunk_bytes, chunk_bytes);
        };
        // Batches of 4 steps, each fence … commit region free of branches (ptxas serializes
        // every wgmma otherwise), the descriptors made before it.
        for (int st0 = 0; st0 < steps; st0 += 4) {
            if (st0 + 4 <= steps) {
                u64 da[4], db[4];
#pragma unroll
                for (int k = 0; k < 4; ++k) desc_of(st0 + k, da[k], db[k]);
                wg_fence();
#pragma unroll
                for (int k = 0; k < 4; ++k) {
#ifndef SKIP_MMA
                    img_mma<T>(acc, da[k], db[k]);
#else
                    acc[k] += (float)(da[k] ^ db[k]);
#endif
                }
                wg_commit();
            } else {
                for (int st = st0; st < steps; ++st) {
                    u64 da, db;
                    desc_of(st, da, db);
                    wg_fence();
#ifndef SKIP_MMA
                    img_mma<T>(acc, da, db);
#else
                    acc[0] += (float)(da ^ db);
#endif
                    wg_commit();
                }
            }
        }
    }
    wg_wait<0>();
    fence_operands1(acc);
    IMG_MARK(2)

    // Accumulator 4·jn + q: channel 16·warp + gq (+8 for q ≥ 2), pixel 8·jn + 2·tq + (q & 1).
    // The outputs leave through this warpgroup's own region of shared memory, its MMAs done:
    // a [channel][pixel] tile (pitch IMG_N + 8, bias and ReLU applied, rounded), then each
    // warp stores whole channels, consecutive lanes consecutive outputs. A tile is whole
    // output rows, so a channel's outputs are one run of its plane: every store instruction
    // writes 32 consecutive outputs. (Stored straight from the accumulators, an instruction
    // wrote 8 planes × 4 scattered pixels, and the epilogue took 21 µs of the 14² 5×5 TF32
    // forward on an H100.)
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, gq = lane >> 2, tq = lane & 3;
    const u64 tile = (u64)blockIdx.x * IMG_WGS + wg;
    const int ldt = IMG_N + 8;
    T* tt = reinterpret_cast<T*>(conv_img_smem + wg * region);
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");  // every warp's MMAs done
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int cl = warp * 16 + gq + half * 8;
        const float b = bias && (u64)cl < c_out ? (float)to_c(bias[cl]) : 0.f;
#pragma unroll
        for (int jn = 0; jn < IMG_N / 8; ++jn)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float v = acc[jn * 4 + half * 2 + e] + b;
                if (relu) v = v <= 0.f ? 0.f : v;
                tt[cl * ldt + jn * 8 + 2 * tq + e] = from_c<T>(v);
            }
    }
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
    if (tile >= tiles) return;
    const u64 img = tile / tiles_per_image;
    const int r0 = (int)(tile - img * tiles_per_image) * rows;
    const int count = min(rows, OH - r0) * OW;
    const u32 plane = (u32)OH * (u32)OW;
    const int channels = (int)min(c_out, (u64)64);
    for (int cl = warp; cl < channels; cl += 4) {
        T* yc = y + (img * c_out + cl) * plane + (u32)r0 * OW;
        const T* tc = tt + cl * ldt;
        int r = 0, c = lane;
        while (c >= OW) c -= OW, ++r;
        for (int e = lane; e < count; e += 32) {
            yc[e] = tc[r * owp + c];
            c += 32;
            while (c >= OW) c -= OW, ++r;
        }
    }
    __syncwarp();
    IMG_MARK(3)
#endif
}

#define CONV_IMG_KERNEL(T, NAME)                                                                      \
    extern "C" __global__ void __launch_bounds__(128 * IMG_WGS, 1) conv_img_##NAME(                 \
        const T* x, const Mma<T>::S* wp, T* y, Win g, u64 c_out, const T* bias, int relu, int rows, \
        int owp, int copies, int slack, int cin_k, int tps) {                                        \
        conv_img_impl<T>(x, wp, y, g, c_out, bias, relu, rows, owp, copies, slack, cin_k, tps);       \
    }
CONV_IMG_KERNEL(float, f32)
CONV_IMG_KERNEL(bf16, bf16)
CONV_IMG_KERNEL(f16, f16)
