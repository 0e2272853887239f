// Standalone timing of kiln's direct convolution forward (conv_direct / conv_direct_wide in
// kernels/window.cu) on the first layers of the issue's networks (b256 1→32 28² 5×5, b1 3→64
// 224² 3×3; f32 and bf16, with bias and ReLU), each output checked against an f64 reference
// on a sample, timed back to back and from idle. DIRECT_PX is the pixels a thread of a
// kernels file that computes several (session 48's experiment,
// bench/results/2026-11-30-h200-session48/direct_pixel_pairs.patch; kiln's computes one):
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_direct/harness.cu -o /tmp/cd && /tmp/cd
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "common.cuh"
#include "window.cuh"
#include "window.cu"
#ifndef DIRECT_PX
#define DIRECT_PX 1
#endif

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(2); } } while (0)

static float bf16_round(float v) {
    unsigned u; memcpy(&u, &v, 4); u += 0x7fff + ((u >> 16) & 1); u &= 0xffff0000u; memcpy(&v, &u, 4); return v;
}

template <typename T> static T make(float v);
template <> float make<float>(float v) { return v; }
template <> bf16 make<bf16>(float v) { unsigned u; float r = bf16_round(v); memcpy(&u, &r, 4); bf16 b; b.bits = (unsigned short)(u >> 16); return b; }
static double val(float v) { return v; }
static double val(bf16 b) { unsigned u = (unsigned)b.bits << 16; float f; memcpy(&f, &u, 4); return f; }

template <typename T>
static int run(const char* name, int n, int c, int h, int co, int k, int pad, bool wide, const char* tname) {
    const int oh = h + 2 * pad - k + 1, ow = oh, taps = c * k * k;
    const size_t nx = (size_t)n * c * h * h, nw = (size_t)co * taps, ny = (size_t)n * co * oh * ow;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    std::vector<T> hx(nx), hw(nw), hb(co);
    for (auto& v : hx) v = make<T>(U(rng));
    for (auto& v : hw) v = make<T>(U(rng) * 0.2f);
    for (auto& v : hb) v = make<T>(U(rng));
    T *x, *w, *b, *y;
    CK(cudaMalloc(&x, nx * sizeof(T))); CK(cudaMalloc(&w, nw * sizeof(T))); CK(cudaMalloc(&b, co * sizeof(T))); CK(cudaMalloc(&y, ny * sizeof(T)));
    CK(cudaMemcpy(x, hx.data(), nx * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), nw * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), co * sizeof(T), cudaMemcpyHostToDevice));
    Win g{};
    g.n = n; g.c = c; g.h = h; g.w = h; g.oh = oh; g.ow = ow; g.kh = k; g.kw = k; g.sh = g.sw = 1; g.ph = g.pw = pad; g.dh = g.dw = 1;
    g.s[3] = 1; g.s[2] = h; g.s[1] = (u64)h * h; g.s[0] = (u64)c * h * h; g.offset = 0;
    const int px = sizeof(typename Compute<T>::type) == 8 ? 1 : DIRECT_PX;
    const size_t items = (size_t)n * oh * ((ow + px - 1) / px);
    const int per = wide ? 2 * DIRECT_CO : DIRECT_CO;
    dim3 grid((unsigned)std::min<size_t>((items + 255) / 256, 132 * 16), (co + per - 1) / per);
    auto kern = wide ? (sizeof(T) == 4 ? (void*)conv_direct_wide_f32 : (void*)conv_direct_wide_bf16)
                     : (sizeof(T) == 4 ? (void*)conv_direct_f32 : (void*)conv_direct_bf16);
    typedef void (*K)(const T*, const T*, T*, Win, u64, const T*, int);
    K f = (K)kern;
    auto launch = [&]() { f<<<grid, 256>>>(x, w, y, g, (u64)co, b, 1); };
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<T> hy(ny);
    CK(cudaMemcpy(hy.data(), y, ny * sizeof(T), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < ny; i += 7) {
        size_t t = i; const int xo = t % ow; t /= ow; const int yo = t % oh; t /= oh; const int o = t % co; const int nn = (int)(t / co);
        double acc = val(hb[o]), mag = fabs(acc);
        for (int ci = 0; ci < c; ++ci) for (int r = 0; r < k; ++r) for (int s = 0; s < k; ++s) {
            const int iy = yo - pad + r, ix = xo - pad + s;
            if (iy < 0 || iy >= h || ix < 0 || ix >= h) continue;
            const double p = val(hx[(((size_t)nn * c + ci) * h + iy) * h + ix]) * val(hw[((size_t)o * c + ci) * k * k + r * k + s]);
            acc += p; mag += fabs(p);
        }
        acc = std::max(acc, 0.0);
        const double tol = (sizeof(T) == 4 ? 1e-5 : 1e-2) * (mag + 1e-3);
        if (!(fabs(val(hy[i]) - acc) <= tol)) bad++;
    }
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 256, 0));
    cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, kern));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> ms, idle;
    for (int r = 0; r < 7; ++r) {
        CK(cudaEventRecord(e0)); for (int i = 0; i < 50; ++i) launch(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
        float t; CK(cudaEventElapsedTime(&t, e0, e1)); ms.push_back(t / 50);
    }
    for (int r = 0; r < 31; ++r) {
        CK(cudaDeviceSynchronize()); CK(cudaEventRecord(e0)); launch(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
        float t; CK(cudaEventElapsedTime(&t, e0, e1)); idle.push_back(t);
    }
    std::sort(ms.begin(), ms.end()); std::sort(idle.begin(), idle.end());
    printf("%-22s %-4s %-6s px %d: grid %u×%u, %d regs, %zu B spilled, %d blocks/SM (%.2f waves): %.4f ms back to back, %.4f from idle; %zu bad\n",
           name, tname, wide ? "wide" : "narrow", px, grid.x, grid.y, fa.numRegs, (size_t)fa.localSizeBytes, occ,
           (double)grid.x * grid.y / (occ * 132.0), ms[3], idle[15], bad);
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y);
    return bad != 0;
}

int main() {
    int fails = 0;
    for (bool wide : {true, false}) {
        fails += run<float>("b256 1->32 28 k5", 256, 1, 28, 32, 5, 2, wide, "f32");
        fails += run<bf16>("b256 1->32 28 k5", 256, 1, 28, 32, 5, 2, wide, "bf16");
        fails += run<float>("b1 3->64 224 k3", 1, 3, 224, 64, 3, 1, wide, "f32");
        fails += run<bf16>("b1 3->64 224 k3", 1, 3, 224, 64, 3, 1, wide, "bf16");
    }
    printf("harness: %d failing runs\n", fails);
    return fails != 0;
}
