// Standalone timing of kiln's direct convolution forward (conv_direct / conv_direct_wide in
// kernels/window.cu) on the first layers of the issue's networks (b256 1→32 28² 5×5, b1 3→64
// 224² 3×3; f32 and bf16, with bias and ReLU), each output checked against an f64 reference
// on a sample, timed back to back and from idle. DIRECT_PX is the pixels a thread of a
// kernels file that computes several (session 48's experiment,
// bench/results/2026-11-30-h200-session48/direct_pixel_pairs.patch; kiln's computes one):
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_direct/harness.cu -o /tmp/cd && /tmp/cd
#include "common.cuh"
#include "window.cuh"
#include "window.cu"
#include "check.cuh"
#ifndef DIRECT_PX
#define DIRECT_PX 1
#endif

template <typename T>
static int run(const char* name, int n, int c, int h, int co, int k, int pad, bool wide, const char* tname) {
    const Problem<T> p(n, c, h, co, k, pad);
    DeviceProblem<T> d(p);
    const Win g = p.win();
    const int px = sizeof(typename Compute<T>::type) == 8 ? 1 : DIRECT_PX;
    const size_t items = (size_t)n * p.oh * ((p.oh + px - 1) / px);
    const int per = wide ? 2 * DIRECT_CO : DIRECT_CO;
    dim3 grid((unsigned)std::min<size_t>((items + 255) / 256, 132 * 16), (co + per - 1) / per);
    auto kern = wide ? (sizeof(T) == 4 ? (void*)conv_direct_wide_f32 : (void*)conv_direct_wide_bf16)
                     : (sizeof(T) == 4 ? (void*)conv_direct_f32 : (void*)conv_direct_bf16);
    typedef void (*K)(const T*, const T*, T*, Win, u64, const T*, int);
    K f = (K)kern;
    auto launch = [&]() { f<<<grid, 256>>>(d.x, d.w, d.y, g, (u64)co, d.b, 1); };
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const size_t bad = p.check(d.output(p.outputs()), sizeof(T) == 4 ? 1e-5 : 1e-2).second;
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 256, 0));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kern));
    const float ms = median_ms_back_to_back(launch), idle = median_ms_from_idle(launch);
    printf("%-22s %-4s %-6s px %d: grid %u×%u, %d regs, %zu B spilled, %d blocks/SM (%.2f waves): %.4f ms back to back, %.4f from idle; %zu bad\n",
           name, tname, wide ? "wide" : "narrow", px, grid.x, grid.y, fa.numRegs, (size_t)fa.localSizeBytes, occ,
           (double)grid.x * grid.y / (occ * 132.0), ms, idle, bad);
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
