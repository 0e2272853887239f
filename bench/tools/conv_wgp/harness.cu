// The persistent warp-specialised convolution (kernels/conv_wgp.cu) against kiln's warpgroup
// kernel (conv_wg64 of kernels/conv_mma.cu, 12 warps) on a few forward problems with bias and
// ReLU: every run checked against an f64 reference (bench/tools/conv_direct/check.cuh), then
// timed back to back and as one call from an idle device (with the filter preparation as its
// own launch, and fused). Built and run on the device machine:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_wgp/harness.cu -o /tmp/wgp && /tmp/wgp [ROUNDS]
#include <cstdio>
#include "common.cuh"
#include "window.cuh"
#include "mma.cuh"
#include "conv_mma.cu"
#include "conv_wgp.cu"
#include "../conv_direct/check.cuh"
#include "../conv_wgmma/plan.cuh"

// Both kernels' parameters: (x, prepared filter, y, window, c_out, bias, relu, then conv_wg's
// rows, cin_k, pitch, taps a slot or conv_wgp's cin_k, pitch, band elements, slots, then the
// packed filter, flip, meet, wait_ns).
template <typename T>
using ConvK = void (*)(const T*, typename Mma<T>::S*, T*, Win, u64, const T*, int, int, int, int, int, const T*, int,
                       u32*, u64);
// One build of the persistent kernel: m64 tiles a consumer, k-steps a batch, consumers.
template <typename T> struct Variant {
    ConvK<T> kernel;
    int wm, kb, consumers;
    const char* name;
};
template <typename T>
using PrepK = void (*)(const T*, typename Mma<T>::S*, u64, u64, u64, u64, u64, int, u32, int);

// One kernel's launches on one problem: back to back with the filter prepared, and one call
// from idle with the preparation as a launch of its own or fused (`meet`).
struct Timing {
    float b2b, idle_prep, idle_fused;
};

template <typename T>
static int run(const char* tname, int n, int c, int h, int co, int k, int pad, PrepK<T> prep, ConvK<T> wg,
               const Variant<T>* vs, int variants, double tol) {
    typedef typename Mma<T>::S S;
    const int elem = sizeof(S);
    Problem<T> pr(n, c, h, co, k, pad);
    const Prob p{"", n, c, h, h, co, k, k, 1, 1, pad, pad, 1, 1};
    const int oh = pr.oh, ow = pr.oh, taps = k * k;
    const Win g = pr.win();
    const DeviceProblem<T> d(pr);
    T *x = d.x, *w = d.w, *b = d.b, *y = d.y;
    const int NT = 64, co_pad = (co + NT - 1) / NT * NT;
    const PlanC pl = plan_for(p, elem, 12, true);
    S* wp;
    CK(cudaMalloc(&wp, (size_t)co_pad * taps * pl.cin_k * elem));
    const u32 chunk = std::max(1, std::min(taps, 8192 / elem / c));
    auto prepare = [&]() { prep<<<co_pad, 256>>>(w, wp, co, c, taps, pl.cin_k, co_pad, 0, chunk, 1); };
    u32* meet;
    CK(cudaMalloc(&meet, 8));
    CK(cudaMemset(meet, 0, 8));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t pixels = (size_t)n * oh * ow;
    std::vector<T> out(pr.outputs());
    int fails = 0;
    auto check = [&](const char* what) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(out.data(), y, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
        const auto [worst, bad] = pr.check(out, tol);
        if (bad) {
            printf("  %s: %zu outputs off (worst %.3g)\n", what, bad, worst);
            fails++;
        }
        return worst;
    };
    auto measure = [&](auto launch) {
        Timing t;
        prepare();
        t.b2b = median_ms_back_to_back([&]() { launch(nullptr); });
        t.idle_prep = median_ms_from_idle([&]() { prepare(); launch(nullptr); });
        t.idle_fused = median_ms_from_idle([&]() { launch(meet); });
        return t;
    };
    // kiln's warpgroup kernel, 12 warps, pixel ranges.
    const dim3 gw((pixels + 383) / 384, co_pad / NT);
    CK(cudaFuncSetAttribute(wg, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    auto launch_wg = [&](u32* m) {
        wg<<<gw, 384, pl.smem>>>(x, wp, y, g, co, b, 1, 0, pl.cin_k, pl.pitch, pl.tps, w, 0, m, 200000);
    };
    prepare();
    CK(cudaMemset(y, 0xff, out.size() * sizeof(T)));
    launch_wg(nullptr);
    double e_wg = check("conv_wg64");
    CK(cudaMemset(y, 0xff, out.size() * sizeof(T)));
    launch_wg(meet);
    check("conv_wg64 fused");
    const Timing t_wg = measure(launch_wg);
    printf("%s b%d %d->%d %d² %dx%d: conv_wg64 (12 warps, tps %d, %d B) err %.2g | %.4f ms b2b, idle %.4f prep / %.4f fused\n",
           tname, n, c, co, h, k, k, pl.tps, pl.smem, e_wg, t_wg.b2b, t_wg.idle_prep, t_wg.idle_fused);
    for (int v = 0; v < variants; ++v) {
        const Variant<T>& V = vs[v];
        const int P = 64 * V.wm, C = V.consumers;
        if ((pl.cin_k * elem / 32) % V.kb) continue;  // a batch must divide a tap's k-steps
        const u32 ntiles = (u32)((pixels + P - 1) / P), per = (ntiles + sms - 1) / sms;
        const dim3 grid((ntiles + per - 1) / per, co_pad / NT);
        const int bh = flat_band_rows(p, oh, ow, P);
        const int rs = pl.bw * pl.pitch + conv_mma_row_pad(pl.bw, ow, 1, pl.pitch * elem / 16) * (16 / elem);
        const int band_bytes = (bh * rs * elem + 127) / 128 * 128, tap_bytes = NT * pl.cin_k * elem;
        const int room = 232448 - 1024 - 128 - C * band_bytes;
        const int slots = std::min(WGP_MAX_SLOTS, room / tap_bytes);
        if (slots < 3) {
            printf("  %s: no room (%d slots)\n", V.name, slots);
            continue;
        }
        const int smem = 128 + C * band_bytes + slots * tap_bytes;
        CK(cudaFuncSetAttribute(V.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        auto launch = [&](u32* m) {
            V.kernel<<<grid, 128 * (C + 1), smem>>>(x, wp, y, g, co, b, 1, pl.cin_k, pl.pitch, band_bytes / elem, slots, w, 0, m,
                                        200000);
        };
        prepare();
        CK(cudaMemset(y, 0xff, out.size() * sizeof(T)));
        launch(nullptr);
        CK(cudaGetLastError());
        const double e = check(V.name);
        CK(cudaMemset(wp, 0xff, (size_t)co_pad * taps * pl.cin_k * elem));
        CK(cudaMemset(y, 0xff, out.size() * sizeof(T)));
        launch(meet);
        launch(meet);  // the counters were reset by the first
        check("fused");
        u32 counters[2];
        CK(cudaMemcpy(counters, meet, 8, cudaMemcpyDeviceToHost));
        if (counters[0] || counters[1]) printf("  counters left at %u %u\n", counters[0], counters[1]), fails++;
#if defined(WGP_TRACE)
        {
            // One launch's phases, averaged over blocks, in µs from the block's start.
            std::vector<long long> tr(1024 * WGP_TRACE_SLOTS, 0);
            CK(cudaMemcpyToSymbol(wgp_trace, tr.data(), tr.size() * 8));
            launch(nullptr);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpyFromSymbol(tr.data(), wgp_trace, tr.size() * 8));
            int khz = 0;
            CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
            const char* what[17] = {"start",    "prologue",  "t0 band",     "t0 mma",      "t0 stores", "t0 w-wait",
                                    "t1 band",  "t1 mma",    "t1 stores",   "t1 w-wait",   "t2 band",   "t2 mma",
                                    "t2 stores", "t2 w-wait", "stage from", "stage to", "last fill"};
            printf("   trace (µs, mean over blocks):");
            for (int i = 1; i < 17; ++i) {
                double sum = 0;
                int cnt = 0;
                for (u32 bl = 0; bl < grid.x; ++bl) {
                    const long long* r = &tr[bl * WGP_TRACE_SLOTS];
                    if (!r[i]) continue;
                    sum += (i == 5 || i == 9 || i == 13) ? (double)r[i] : (double)(r[i] - r[0]);
                    cnt++;
                }
                if (cnt) printf(" %s %.2f", what[i], sum / cnt / (khz * 1e-3));
            }
            printf("\n");
        }
#endif
        const Timing t = measure(launch);
        printf("  %-12s grid %u (%u tiles of %d), %d slots, %d B: err %.2g | %.4f ms b2b, idle %.4f prep / %.4f fused | %.2fx b2b, %.2fx fused\n",
               V.name, grid.x, ntiles, P, slots, smem, e, t.b2b, t.idle_prep, t.idle_fused, t_wg.b2b / t.b2b,
               t_wg.idle_fused / t.idle_fused);
    }
    cudaFree(wp); cudaFree(meet);
    return fails;
}

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 1;
    const Variant<float> f32k[] = {{conv_wgp64_f32_m3k2c2, 3, 2, 2, "m3 c2"}, {conv_wgp64_f32_m2k2c3, 2, 2, 3, "m2 c3"}};
    const Variant<bf16> bf16k[] = {{conv_wgp64_bf16_m3k2c2, 3, 2, 2, "m3 c2"}, {conv_wgp64_bf16_m2k2c3, 2, 2, 3, "m2 c3"}};
    int fails = 0;
    for (int r = 0; r < rounds; ++r) {
        printf("== round %d\n", r);
        fails += run<float>("tf32", 256, 32, 14, 64, 5, 2, conv_mma_weights_f32, conv_wg64_f32, f32k, 2, 2e-3);
        fails += run<bf16>("bf16", 256, 32, 14, 64, 5, 2, conv_mma_weights_bf16, conv_wg64_bf16, bf16k, 2, 1e-2);
        if (r == 0) {
            fails += run<float>("tf32", 32, 32, 28, 64, 3, 1, conv_mma_weights_f32, conv_wg64_f32, f32k, 2, 2e-3);
            fails += run<float>("tf32", 3, 13, 11, 40, 3, 1, conv_mma_weights_f32, conv_wg64_f32, f32k, 2, 2e-3);
            fails += run<bf16>("bf16", 5, 24, 9, 40, 3, 0, conv_mma_weights_bf16, conv_wg64_bf16, bf16k, 2, 1e-2);
        }
    }
    printf("harness: %d failing checks\n", fails);
    return fails != 0;
}
