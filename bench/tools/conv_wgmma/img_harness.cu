// Standalone A/B of kiln's two warpgroup-MMA convolution kernels: conv_wg64 (conv_mma.cu:
// pixels as M) against conv_img (conv_img.cu: channels as M, a tile of output rows as N),
// both checked against an f64 reference on a sample of outputs and timed back to back
// (median of 7 runs of 50 launches) and from an idle device. Built on the device machine:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_wgmma/img_harness.cu -o /tmp/conv_img && /tmp/conv_img
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "common.cuh"
#include "window.cuh"
#include "conv_mma.cu"
#include "conv_img.cu"

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e = (x);                                                                  \
        if (e != cudaSuccess) {                                                               \
            printf("CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e)); \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

struct Prob {
    const char* name;
    int n, c, h, w, co, kh, kw, ph, pw;
};

template <typename T> T to_t(float v);
template <> float to_t<float>(float v) { return v; }
template <> bf16 to_t<bf16>(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    u += 0x7fff + ((u >> 16) & 1);
    bf16 b;
    b.bits = (unsigned short)(u >> 16);
    return b;
}
static float from_t(float v) { return v; }
static float from_t(bf16 b) {
    unsigned u = (unsigned)b.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

template <typename T>
static int run(const Prob& p, const char* tname,
               void (*prep)(const T*, typename Mma<T>::S*, u64, u64, u64, u64, u64, int, u32, int),
               void (*wg_k)(const T*, typename Mma<T>::S*, T*, Win, u64, const T*, int, int, int, int, int, const T*, int, u32*, u64),
               void (*img_k)(const T*, const typename Mma<T>::S*, T*, Win, u64, const T*, int, int, int, int, int, int, int),
               double tol) {
    typedef typename Mma<T>::S S;
    const int elem = sizeof(S);
    const int oh = p.h + 2 * p.ph - p.kh + 1, ow = p.w + 2 * p.pw - p.kw + 1, taps = p.kh * p.kw;
    size_t nx = (size_t)p.n * p.c * p.h * p.w, nw = (size_t)p.co * p.c * taps, ny = (size_t)p.n * p.co * oh * ow;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<T> hx(nx), hw(nw), hb(p.co);
    std::vector<double> dx(nx), dw(nw), db(p.co);
    for (size_t i = 0; i < nx; ++i) { hx[i] = to_t<T>(u(rng)); dx[i] = from_t(hx[i]); }
    for (size_t i = 0; i < nw; ++i) { hw[i] = to_t<T>(u(rng) * 0.2f); dw[i] = from_t(hw[i]); }
    for (int i = 0; i < p.co; ++i) { hb[i] = to_t<T>(u(rng)); db[i] = from_t(hb[i]); }
    T *x, *w, *b, *y0, *y1;
    CK(cudaMalloc(&x, nx * sizeof(T)));
    CK(cudaMalloc(&w, nw * sizeof(T)));
    CK(cudaMalloc(&b, p.co * sizeof(T)));
    CK(cudaMalloc(&y0, ny * sizeof(T)));
    CK(cudaMalloc(&y1, ny * sizeof(T)));
    CK(cudaMemcpy(x, hx.data(), nx * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), nw * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), p.co * sizeof(T), cudaMemcpyHostToDevice));
    // Both kernels read the chunked layout [tap][16-byte chunk][co (64)][16 bytes].
    const int step = 32 / elem, cin_k = (p.c + step - 1) / step * step, chunks = cin_k * elem / 16;
    S* wp;
    CK(cudaMalloc(&wp, (size_t)64 * taps * cin_k * elem));
    u32 chunk = std::max(1, std::min(taps, 8192 / elem / p.c));
    prep<<<64, 256>>>(w, wp, p.co, p.c, taps, cin_k, 64, 0, chunk, 1);
    Win g{};
    g.n = p.n; g.c = p.c; g.h = p.h; g.w = p.w; g.oh = oh; g.ow = ow;
    g.kh = p.kh; g.kw = p.kw; g.sh = 1; g.sw = 1; g.ph = p.ph; g.pw = p.pw; g.dh = 1; g.dw = 1;
    g.s[0] = (u64)p.c * p.h * p.w; g.s[1] = (u64)p.h * p.w; g.s[2] = p.w; g.s[3] = 1; g.offset = 0;
    // conv_wg64, 12 warps, as kiln plans it (flat range, 3 slots).
    const int units = cin_k * elem / 16, pitch = (units + 1 - units % 2) * 16 / elem, bw = ow + p.kw - 1;
    int t = (ow - 1 + 383) / ow + 1, most = std::min(t, (t - 1 + oh - 1) / oh + 1), bh = p.kh;
    for (int sg : {1, most}) bh = std::max(bh, (t - sg) + sg * p.kh);
    auto wg_smem = [&](int tp) { return (bh * bw * pitch + 3 * tp * 64 * cin_k) * elem + 128; };
    int wg_tps = 1;
    for (int tp = taps; tp >= 1; --tp)
        if (wg_smem(tp) <= 232448) { wg_tps = tp; break; }
    int wg_sm = std::max(wg_smem(wg_tps), elem == 2 ? 64 * (384 + 8) * elem : 0);
    // conv_img: tiles of `rows` output rows padded to owp columns.
    const int owp = (ow + 7) / 8 * 8, slack = owp - ow, copies = (p.kw + slack) / (slack + 1);
    const int rows = std::min(oh, IMG_N / owp), band_px = (rows + p.kh - 1) * owp + slack;
    const int tile_bytes = copies * chunks * band_px * 16;
    const int region = std::max(tile_bytes, (int)(64 * (IMG_N + 8) * sizeof(T)));
    auto img_smem = [&](int tp) { return IMG_WGS * region + 128 + IMG_STAGES * tp * chunks * 1024; };
    int img_tps = 0;
    for (int tp = taps; tp >= 1; --tp)
        if (img_smem(tp) <= 232448) { img_tps = tp; break; }
    if (!img_tps) { printf("%s %s: conv_img does not fit\n", p.name, tname); return 0; }
    const int tiles = p.n * ((oh + rows - 1) / rows);
    CK(cudaFuncSetAttribute(wg_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    CK(cudaFuncSetAttribute(img_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    size_t pixels = (size_t)p.n * oh * ow;
    auto launch_wg = [&]() {
        wg_k<<<(pixels + 383) / 384, 384, wg_sm>>>(x, wp, y0, g, p.co, b, 0, 0, cin_k, pitch, wg_tps, w, 0, nullptr, 0);
    };
    auto launch_img = [&]() {
        img_k<<<(tiles + IMG_WGS - 1) / IMG_WGS, 128 * IMG_WGS, img_smem(img_tps)>>>(x, wp, y1, g, p.co, b, 0, rows, owp,
                                                                                      copies, slack, cin_k, img_tps);
    };
    CK(cudaMemset(y1, 0xff, ny * sizeof(T)));
    launch_wg();
    launch_img();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<T> r0(ny), r1(ny);
    CK(cudaMemcpy(r0.data(), y0, ny * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r1.data(), y1, ny * sizeof(T), cudaMemcpyDeviceToHost));
    size_t stride = ny > 400000 ? 97 : 1, checked = 0, bad0 = 0, bad1 = 0;
    double worst0 = 0, worst1 = 0;
    for (size_t i = 0; i < ny; i += stride) {
        size_t q = i;
        int xw = q % ow; q /= ow;
        int yh = q % oh; q /= oh;
        int co = q % p.co; q /= p.co;
        int nn = (int)q;
        double acc = db[co], mag = fabs(db[co]);
        for (int ci = 0; ci < p.c; ++ci)
            for (int r = 0; r < p.kh; ++r)
                for (int s = 0; s < p.kw; ++s) {
                    int iy = yh - p.ph + r, ix = xw - p.pw + s;
                    if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                    double v = dx[(((size_t)nn * p.c + ci) * p.h + iy) * p.w + ix] * dw[(((size_t)co * p.c + ci) * p.kh + r) * p.kw + s];
                    acc += v;
                    mag += fabs(v);
                }
        double lim = tol * mag + 1e-6;
        double e0 = fabs(from_t(r0[i]) - acc), e1 = fabs(from_t(r1[i]) - acc);
        if (!(e0 <= lim)) bad0++;
        if (!(e1 <= lim)) {
            if (bad1 < 5) printf("  mismatch at n%d co%d y%d x%d: img %g ref %g (wg %g)\n", nn, co, yh, xw, from_t(r1[i]), acc, from_t(r0[i]));
            bad1++;
        }
        worst0 = std::max(worst0, e0 / lim);
        worst1 = std::max(worst1, e1 / lim);
        checked++;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto time = [&](auto f) {
        std::vector<float> ms;
        for (int i = 0; i < 5; ++i) f();
        for (int r = 0; r < 7; ++r) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 50; ++i) f();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms1;
            CK(cudaEventElapsedTime(&ms1, e0, e1));
            ms.push_back(ms1 / 50);
        }
        std::sort(ms.begin(), ms.end());
        return ms[3];
    };
    auto single = [&](auto f) {
        std::vector<float> ms;
        for (int r = 0; r < 31; ++r) {
            CK(cudaDeviceSynchronize());
            CK(cudaEventRecord(e0));
            f();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms1;
            CK(cudaEventElapsedTime(&ms1, e0, e1));
            ms.push_back(ms1);
        }
        std::sort(ms.begin(), ms.end());
        return ms[15];
    };
    double t_wg = time(launch_wg), t_img = time(launch_img), t_wg2 = time(launch_wg), t_img2 = time(launch_img);
    double s_wg = single(launch_wg), s_img = single(launch_img);
    double flops = 2.0 * ny * p.c * taps;
#ifdef IMG_TIMES
    {
        // Block phases of one more launch (thread 0's clock): staging, MMAs, epilogue.
        launch_img();
        CK(cudaDeviceSynchronize());
        static u64 ts[4096][4];
        CK(cudaMemcpyFromSymbol(ts, img_times, sizeof(ts)));
        int nb = std::min(4096, (tiles + IMG_WGS - 1) / IMG_WGS);
        u64 t0 = ~0ull, tend = 0;
        double ph[3] = {0, 0, 0};
        for (int i = 0; i < nb; ++i) {
            t0 = std::min(t0, ts[i][0]);
            tend = std::max(tend, ts[i][3]);
            for (int k = 0; k < 3; ++k) ph[k] += (double)(ts[i][k + 1] - ts[i][k]) / nb;
        }
        u64 last_start = 0;
        for (int i = 0; i < nb; ++i) last_start = std::max(last_start, ts[i][0]);
        printf("  img phases (mean µs): staging %.2f, MMAs %.2f, epilogue %.2f; first start to last end %.2f, starts spread %.2f\n",
               ph[0] / 1e3, ph[1] / 1e3, ph[2] / 1e3, (tend - t0) / 1e3, (last_start - t0) / 1e3);
    }
#endif
    printf("%-22s %-4s checked %zu: wg bad %zu (worst %.2f), img bad %zu (worst %.2f) | wg12 tps %d: %.4f/%.4f ms (idle %.4f) %.0f TF | img rows %d owp %d copies %d tps %d smem %d: %.4f/%.4f ms (idle %.4f) %.0f TF | %.2fx\n",
           p.name, tname, checked, bad0, worst0, bad1, worst1, wg_tps, t_wg, t_wg2, s_wg, flops / t_wg * 1e-9, rows, owp, copies,
           img_tps, img_smem(img_tps), t_img, t_img2, s_img, flops / t_img * 1e-9, std::min(t_wg, t_wg2) / std::min(t_img, t_img2));
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y0); cudaFree(y1); cudaFree(wp);
    return bad1 > 0 || bad0 > 0;
}

int main(int argc, char** argv) {
    Prob probs[] = {
        {"b256 32-64 14 k5", 256, 32, 14, 14, 64, 5, 5, 2, 2},
        {"b32 32-64 28 k3", 32, 32, 28, 28, 64, 3, 3, 1, 1},
        {"odd b3 20-40 13x11 k3x5", 3, 20, 13, 11, 40, 3, 5, 1, 2},
    };
    int count = argc > 1 ? atoi(argv[1]) : 3;
    int fails = 0;
    for (const Prob& p : probs) {
        if (count-- <= 0) break;
        fails += run<float>(p, "tf32", conv_mma_weights_f32, conv_wg64_f32, conv_img_f32, 2e-3);
        fails += run<bf16>(p, "bf16", conv_mma_weights_bf16, conv_wg64_bf16, conv_img_bf16, 1e-2);
    }
    printf("img harness: %d failing runs\n", fails);
    return fails != 0;
}
