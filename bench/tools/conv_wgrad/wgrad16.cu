// Standalone A/B (session 47): kiln's weight-gradient kernel (kernels/conv_wgrad_mma.cu) on
// 16-bit inputs, conv_wgrad_mma4x5_{bf16,f16}. bf16 and f16 values are exact in TF32, so the
// TF32 MMAs give the products exactly and the sums in f32, as a 16-bit MMA would; the copies
// move half the bytes into raw buffers and a widening pass replaces the rounding pass.
//
// Question: does it beat cuDNN's bf16 weight gradient (b256 32→64 14² 5×5: engine 65,
// 0.054 ms back to back / 0.064 from idle in kiln's measurement, session 47)? Checked against
// an f64 reference of the same 16-bit values; timed back to back like bench.cu.
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        -DWGRAD_MMA_THREADS=320 -DWGRAD_MMA_BLOCKS=1 bench/tools/conv_wgrad/wgrad16.cu -o /tmp/w16
//   /tmp/w16 N C K H W R S PAD GROUPS [PARTS...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <vector>
#include "common.cuh"
#include "window.cuh"
#include "conv_mma.cu"
#include "conv_wgrad_mma.cu"
#include "reference.cuh"
#include "../harness_common.cuh"



template <typename T>
__global__ void fill(T* v, u64 n, u32 seed) {
    GRID_LOOP(i, n) {
        u32 h = (u32)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        v[i] = from_c<T>((float)(h & 0xffffff) / 8388608.f - 1.f);
    }
}

template <typename T>
int run(const char* name, int argc, char** argv) {
    const int N = atoi(argv[1]), C = atoi(argv[2]), K = atoi(argv[3]), H = atoi(argv[4]), W = atoi(argv[5]);
    const int R = atoi(argv[6]), S = atoi(argv[7]), P = atoi(argv[8]), G = atoi(argv[9]);
    Win g{};
    g.n = N; g.c = C; g.h = H; g.w = W; g.kh = R; g.kw = S; g.sh = g.sw = 1; g.ph = g.pw = P; g.dh = g.dw = 1;
    g.oh = H + 2 * P - R + 1; g.ow = W + 2 * P - S + 1;
    g.s[3] = 1; g.s[2] = W; g.s[1] = (u64)H * W; g.s[0] = (u64)C * H * W; g.offset = 0;
    const u64 nx = (u64)N * C * H * W, ny = (u64)N * K * g.oh * g.ow, nw = (u64)K * C * R * S;
    T *x, *dy; float *dw, *part, *bpart, *db; double *ref, *mag;
    CK(cudaMalloc(&x, nx * 2)); CK(cudaMalloc(&dy, ny * 2)); CK(cudaMalloc(&dw, nw * 4));
    CK(cudaMalloc(&part, nw * 4 * 1024)); CK(cudaMalloc(&bpart, 4096 * 1024 * 4)); CK(cudaMalloc(&db, K * 4));
    CK(cudaMalloc(&ref, nw * 8)); CK(cudaMalloc(&mag, nw * 8));
    fill<<<512, 256>>>(x, nx, 1u); fill<<<512, 256>>>(dy, ny, 2u);
    wgrad_reference<<<1024, 128>>>(x, dy, ref, mag, g, K);
    CK(cudaDeviceSynchronize());
    std::vector<double> href(nw), hmag(nw);
    CK(cudaMemcpy(href.data(), ref, nw * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hmag.data(), mag, nw * 8, cudaMemcpyDeviceToHost));
    constexpr int MT = 4, SW = 5;
    if (K > 64 || S > 5 || S < 4) { printf("this experiment builds MT 4 × SW 5 only\n"); return 1; }
    void (*kern)(const T*, const T*, float*, float*, Win, u64, WgradMma);
    if constexpr (std::is_same<T, bf16>::value) kern = conv_wgrad_mma4x5_bf16;
    else kern = conv_wgrad_mma4x5_f16;
    std::vector<int> parts_list;
    for (int i = 10; i < argc; ++i) parts_list.push_back(atoi(argv[i]));
    if (parts_list.empty()) parts_list = {66};
    const int ci_blocks = (C + 8 * G - 1) / (8 * G), co_blocks = (K + 16 * MT - 1) / (16 * MT);
    const int bh = (int)g.oh;
    const int npix = bh * (int)g.ow, p8 = (npix + 7) & ~7;
    WgradMma m{};
    m.bh = bh;
    m.dp = p8; while (m.dp % 8 != 4) ++m.dp;
    m.xh = (bh - 1) + (R - 1) + 1;
    m.pairs = 1;
    m.vec = (g.oh * g.ow) % 4 == 0 && npix % 4 == 0;
    m.col0 = (P + 1) / 2 * 2;
    m.xw = std::max(m.col0 + W, m.col0 - P + (int)g.ow - 1 + S); m.xw += m.xw % 2;
    m.xp = m.xh * m.xw; while (m.xp % 8 != 4) ++m.xp;
    const int CO = 16 * MT, CI = 8 * G, table = p8 + 16;
    const int stage_words = CO * m.dp + CI * m.xp;
    if (stage_words % 8) { printf("stage of %d words: not a multiple of 8\n", stage_words); return 1; }
    const int smem = (2 * stage_words + SW + 8 + table + CO) * 4;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, kern));
    printf("%s b%d %d->%d %dx%d k%dx%d pad %d: G %d, bh %d, smem %d B, regs %d, spill %zu B\n", name, N, C, K, H, W,
           R, S, P, G, bh, smem, fa.numRegs, fa.localSizeBytes);
    for (int parts : parts_list) {
        dim3 grid(parts, ci_blocks, co_blocks);
        const u64 frags = (u64)ci_blocks * co_blocks * (R * G) * MT * SW * 128;
        WgradFrag f{MT, SW, R * G, R, S, ci_blocks, (u64)C, (u64)K};
        const u64 bias_cols = (u64)co_blocks * 16 * MT, frag_blocks = (frags / 4 + WGRAD_SUM_COLS - 1) / WGRAD_SUM_COLS;
        auto call = [&](int mode) {
            kern<<<grid, 32 * R * G, smem>>>(x, dy, part, mode == 2 ? bpart : nullptr, g, (u64)K, m);
            if (mode == 1) conv_wgrad_mma_sum_f32<<<frag_blocks, 256>>>(part, dw, frags, parts, f, nullptr, nullptr, 0);
            if (mode == 2)
                conv_wgrad_mma_sum_f32<<<frag_blocks + (bias_cols + WGRAD_SUM_COLS - 1) / WGRAD_SUM_COLS, 256>>>(
                    part, dw, frags, parts, f, bpart, db, bias_cols);
        };
        CK(cudaMemset(dw, 0xff, nw * 4));
        call(2);
        CK(cudaDeviceSynchronize());
        std::vector<float> hw(nw);
        CK(cudaMemcpy(hw.data(), dw, nw * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (u64 e = 0; e < nw; ++e) {
            const double err = fabs(hw[e] - href[e]);
            worst = std::isnan(err) ? 1e30 : std::max(worst, err / hmag[e]);
        }
        double med[3];
        for (int ws = 0; ws < 3; ++ws) med[ws] = 1000 * median_ms_back_to_back([&]() { call(ws); });
        // One call from idle (kernel + sum with the bias), as kiln's bench times a call.
        const double one = 1000 * median_ms_from_idle([&]() { call(2); });
        printf("%s parts %3d: kernel %.1f us, with sum %.1f us, with the bias %.1f us, from idle %.1f us; error max %.2e of sum|x·dy|%s\n",
               name, parts, med[0], med[1], med[2], one, worst, worst < 1e-5 ? "" : "  WRONG");
    }
    CK(cudaGetLastError());
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 10) { printf("usage: N C K H W R S PAD GROUPS [PARTS...]\n"); return 1; }
    run<bf16>("bf16", argc, argv);
    run<f16>("f16", argc, argv);
    return 0;
}
