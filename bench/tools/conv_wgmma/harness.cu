// Standalone A/B of kiln's tensor-core convolution kernels (kernels/conv_mma.cu): the
// mma.sync kernel (conv_mma64) against the warpgroup-MMA kernel (conv_wg64) on one problem,
// both checked against an f64 reference on a sample of outputs and timed back to back with
// CUDA events (median of 7 runs of 50 launches). Built on the device machine:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_wgmma/harness.cu -o /tmp/conv_wg && /tmp/conv_wg
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "common.cuh"
#include "window.cuh"
#include "mma.cuh"
#include "conv_mma.cu"
#include "../harness_common.cuh"
#include "plan.cuh"


template <typename T>
static int run(const Prob& p, const char* tname, void (*prep)(const T*, typename Mma<T>::S*, u64, u64, u64, u64, u64, int, u32, int),
               void (*old_k)(const T*, typename Mma<T>::S*, T*, Win, u64, const T*, int, int, int, int, int, const T*, int, u32*, u64),
               void (*new_k)(const T*, typename Mma<T>::S*, T*, Win, u64, const T*, int, int, int, int, int, const T*, int, u32*, u64),
               int old_warps, int new_warps, double tol) {
    typedef typename Mma<T>::S S;
    const int elem = sizeof(S);
    int oh = (p.h + 2 * p.ph - (p.kh - 1) * p.dh - 1) / p.sh + 1, ow = (p.w + 2 * p.pw - (p.kw - 1) * p.dw - 1) / p.sw + 1;
    int taps = p.kh * p.kw;
    size_t nx = (size_t)p.n * p.c * p.h * p.w, nw = (size_t)p.co * p.c * taps, ny = (size_t)p.n * p.co * oh * ow;
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<T> hx(nx), hw(nw), hb(p.co);
    std::vector<double> dx(nx), dw(nw), db(p.co);
    for (size_t i = 0; i < nx; ++i) { hx[i] = round_to<T>(u(rng)); dx[i] = widen(hx[i]); }
    for (size_t i = 0; i < nw; ++i) { hw[i] = round_to<T>(u(rng) * 0.2f); dw[i] = widen(hw[i]); }
    for (int i = 0; i < p.co; ++i) { hb[i] = round_to<T>(u(rng)); db[i] = widen(hb[i]); }
    T *x, *w, *b, *y0, *y1;
    CK(cudaMalloc(&x, nx * sizeof(T)));
    CK(cudaMalloc(&w, nw * sizeof(T)));
    CK(cudaMalloc(&b, p.co * sizeof(T)));
    CK(cudaMalloc(&y0, ny * sizeof(T)));
    CK(cudaMalloc(&y1, ny * sizeof(T)));
    CK(cudaMemcpy(x, hx.data(), nx * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), nw * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), p.co * sizeof(T), cudaMemcpyHostToDevice));
    int channels = p.co > 32 ? 64 : 32, co_pad = (p.co + channels - 1) / channels * channels;
    PlanC po = plan_for(p, elem, old_warps, false), pn = plan_for(p, elem, new_warps, true);
    S *wp0, *wp1;
    CK(cudaMalloc(&wp0, (size_t)co_pad * taps * po.pitch * elem));
    CK(cudaMalloc(&wp1, (size_t)co_pad * taps * pn.cin_k * elem));
    u32 chunk = std::max(1, std::min(taps, 8192 / elem / p.c));
    prep<<<co_pad, 256>>>(w, wp0, p.co, p.c, taps, po.pitch, co_pad, 0, chunk, 0);
    prep<<<co_pad, 256>>>(w, wp1, p.co, p.c, taps, pn.cin_k, co_pad, 0, chunk, 1);
    CK(cudaGetLastError());
    Win g{};
    g.n = p.n; g.c = p.c; g.h = p.h; g.w = p.w; g.oh = oh; g.ow = ow;
    g.kh = p.kh; g.kw = p.kw; g.sh = p.sh; g.sw = p.sw; g.ph = p.ph; g.pw = p.pw; g.dh = p.dh; g.dw = p.dw;
    g.s[0] = (u64)p.c * p.h * p.w; g.s[1] = (u64)p.h * p.w; g.s[2] = p.w; g.s[3] = 1; g.offset = 0;
    CK(cudaFuncSetAttribute(old_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    CK(cudaFuncSetAttribute(new_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    size_t pixels = (size_t)p.n * oh * ow;
    dim3 go((pixels + po.warps * 32 - 1) / (po.warps * 32), co_pad / channels), gn((pixels + pn.warps * 32 - 1) / (pn.warps * 32), co_pad / channels);
    // The grid meeting's counters for the fused filter preparation (kiln's `meet`).
    u32* meet;
    CK(cudaMalloc(&meet, 8));
    CK(cudaMemset(meet, 0, 8));
    auto launch_old = [&]() { old_k<<<go, po.warps * 32, po.smem>>>(x, wp0, y0, g, p.co, b, 0, 0, po.cin_k, po.pitch, po.tps, w, 0, nullptr, 0); };
    auto launch_new = [&]() { new_k<<<gn, pn.warps * 32, pn.smem>>>(x, wp1, y1, g, p.co, b, 0, 0, pn.cin_k, pn.pitch, pn.tps, w, 0, nullptr, 0); };
    // The same with the preparation fused (every block resident: one wave here), waiting up
    // to wait_ns for the other blocks' slices (0: every block prepares the whole filter).
    auto launch_fused = [&](u64 wait_ns) {
        new_k<<<gn, pn.warps * 32, pn.smem>>>(x, wp1, y1, g, p.co, b, 0, 0, pn.cin_k, pn.pitch, pn.tps, w, 0, meet, wait_ns);
    };
    auto launch_fused_old = [&]() { old_k<<<go, po.warps * 32, po.smem>>>(x, wp0, y0, g, p.co, b, 0, 0, po.cin_k, po.pitch, po.tps, w, 0, meet, 200000); };
    CK(cudaMemset(y1, 0xff, ny * sizeof(T)));
    launch_old();
    launch_new();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<T> r0(ny), r1(ny);
    CK(cudaMemcpy(r0.data(), y0, ny * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r1.data(), y1, ny * sizeof(T), cudaMemcpyDeviceToHost));
    // The f64 reference on a sample of outputs (every output of small problems).
    size_t stride = ny > 400000 ? 97 : 1, checked = 0, bad0 = 0, bad1 = 0;
    double worst0 = 0, worst1 = 0;
    for (size_t i = 0; i < ny; i += stride) {
        size_t t = i;
        int xw = t % ow; t /= ow;
        int yh = t % oh; t /= oh;
        int co = t % p.co; t /= p.co;
        int nn = (int)t;
        double acc = db[co], mag = fabs(db[co]);
        for (int ci = 0; ci < p.c; ++ci)
            for (int r = 0; r < p.kh; ++r)
                for (int s = 0; s < p.kw; ++s) {
                    int iy = yh * p.sh - p.ph + r * p.dh, ix = xw * p.sw - p.pw + s * p.dw;
                    if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                    double v = dx[(((size_t)nn * p.c + ci) * p.h + iy) * p.w + ix] * dw[(((size_t)co * p.c + ci) * p.kh + r) * p.kw + s];
                    acc += v;
                    mag += fabs(v);
                }
        double lim = tol * mag + 1e-6;
        double e0 = fabs(widen(r0[i]) - acc), e1 = fabs(widen(r1[i]) - acc);
        if (!(e0 <= lim)) bad0++;
        if (!(e1 <= lim)) {
            if (bad1 < 5) printf("  mismatch at n%d co%d y%d x%d: wg %g ref %g (mma %g)\n", nn, co, yh, xw, widen(r1[i]), acc, widen(r0[i]));
            bad1++;
        }
        worst0 = std::max(worst0, e0 / lim);
        worst1 = std::max(worst1, e1 / lim);
        checked++;
    }
    // The fused preparation must give the same bits, with and without the wait.
    int occ_new = 0, occ_old = 0, sms = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_new, new_k, pn.warps * 32, pn.smem));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_old, old_k, po.warps * 32, po.smem));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bool fits_new = gn.x * gn.y <= (unsigned)(occ_new * sms), fits_old = go.x * go.y <= (unsigned)(occ_old * sms);
    size_t fused_diff = 0;
    for (u64 wait_ns : {200000ull, 0ull}) {
        if (!fits_new) break;
        CK(cudaMemset(wp1, 0xff, (size_t)co_pad * taps * pn.cin_k * elem));
        CK(cudaMemset(y1, 0xff, ny * sizeof(T)));
        launch_fused(wait_ns);
        launch_fused(wait_ns);  // the counters were reset by the first
        CK(cudaDeviceSynchronize());
        std::vector<T> r2(ny);
        CK(cudaMemcpy(r2.data(), y1, ny * sizeof(T), cudaMemcpyDeviceToHost));
        fused_diff += memcmp(r2.data(), r1.data(), ny * sizeof(T)) != 0;
    }
    if (fits_old) {
        CK(cudaMemset(wp0, 0xff, (size_t)co_pad * taps * po.pitch * elem));
        launch_fused_old();
        CK(cudaDeviceSynchronize());
        std::vector<T> r2(ny);
        CK(cudaMemcpy(r2.data(), y0, ny * sizeof(T), cudaMemcpyDeviceToHost));
        fused_diff += memcmp(r2.data(), r0.data(), ny * sizeof(T)) != 0;
    }
    u32 counters[2];
    CK(cudaMemcpy(counters, meet, 8, cudaMemcpyDeviceToHost));
    printf("  fused preparation (wg fits one wave: %d, mma: %d): %zu differing runs, counters after %u %u\n", fits_new, fits_old, fused_diff, counters[0], counters[1]);
    if (fused_diff || counters[0] || counters[1]) bad1++;
    // Timing: 7 runs of 50 launches each, medians.
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
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t / 50);
        }
        std::sort(ms.begin(), ms.end());
        return ms[3];
    };
    double t_old = time(launch_old), t_new = time(launch_new);
    double t_old2 = time(launch_old), t_new2 = time(launch_new);
    // As kiln's bench times a call: the device idle, one event before the call's launches
    // (the filter preparation, then the convolution) and one after, median of 31.
    auto single = [&](int mode) {
        std::vector<float> ms;
        for (int r = 0; r < 31; ++r) {
            CK(cudaDeviceSynchronize());
            CK(cudaEventRecord(e0));
            if (mode == 0) prep<<<co_pad, 256>>>(w, wp1, p.co, p.c, taps, pn.cin_k, co_pad, 0, chunk, 1);
            if (mode == 2 && fits_new) launch_fused(200000);
            else launch_new();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return ms[15];
    };
    printf("  one wg call from idle: %.4f ms with the filter preparation, %.4f fused, %.4f without\n", single(0), single(2), single(1));
    double t_fused = fits_new ? time([&]() { launch_fused(200000); }) : 0;
    printf("  wg back to back: fused %.4f ms\n", t_fused);
    double flops = 2.0 * ny * p.c * taps;
    printf("%-26s %-4s checked %zu: mma bad %zu (worst %.2f of tol), wg bad %zu (worst %.2f) | mma flat %d (tps %d, %d B): %.4f/%.4f ms %.0f TF | wg flat %d (tps %d, %d B): %.4f/%.4f ms %.0f TF | %.2fx\n",
           p.name, tname, checked, bad0, worst0, bad1, worst1, po.warps, po.tps, po.smem, t_old, t_old2, flops / t_old * 1e-9,
           pn.warps, pn.tps, pn.smem, t_new, t_new2, flops / t_new * 1e-9, std::min(t_old, t_old2) / std::min(t_new, t_new2));
    cudaFree(meet);
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y0); cudaFree(y1); cudaFree(wp0); cudaFree(wp1);
    return bad1 > 0 || bad0 > 0;
}

int main(int argc, char** argv) {
    int warps = argc > 1 ? atoi(argv[1]) : 4;
    Prob probs[] = {
        {"b256 32-64 14 k5", 256, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2, 1, 1},
        {"b32 32-64 28 k3", 32, 32, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1},
        {"odd b3 13-100 11x9 s2 d2", 3, 13, 11, 9, 100, 3, 3, 2, 2, 1, 2, 2, 1},
        {"odd b5 40-24 9x13 k3", 5, 40, 9, 13, 24, 3, 2, 1, 1, 1, 0, 1, 2},
        // The input gradient of the first: 64 → 32 channels (conv_wg32).
        {"b256 64-32 14 k5", 256, 64, 14, 14, 32, 5, 5, 1, 1, 2, 2, 1, 1},
    };
    // argv[2]: how many of the problems (default all); argv[3] = "tf32" or "bf16": that one
    // only; argv[4]: only the problem of that index.
    int count = argc > 2 ? atoi(argv[2]) : 5;
    const char* only = argc > 3 ? argv[3] : "";
    const int pick = argc > 4 ? atoi(argv[4]) : -1;
    int fails = 0, index = -1;
    for (const Prob& p : probs) {
        if (count-- <= 0) break;
        if (++index != pick && pick >= 0) continue;
        const bool tf32 = strcmp(only, "bf16") != 0, bf = strcmp(only, "tf32") != 0;
        if (p.co > 32) {
            if (tf32) fails += run<float>(p, "tf32", conv_mma_weights_f32, conv_mma64_f32, conv_wg64_f32, 6, warps, 2e-3);
            if (bf) fails += run<bf16>(p, "bf16", conv_mma_weights_bf16, conv_mma64_bf16, conv_wg64_bf16, 6, warps, 1e-2);
        } else {
            if (tf32) fails += run<float>(p, "tf32", conv_mma_weights_f32, conv_mma32_f32, conv_wg32_f32, 6, warps, 2e-3);
            if (bf) fails += run<bf16>(p, "bf16", conv_mma_weights_bf16, conv_mma32_bf16, conv_wg32_bf16, 6, warps, 1e-2);
        }
    }
    printf("harness: %d failing runs\n", fails);
    return fails != 0;
}
