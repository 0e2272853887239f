// Standalone A/B of kiln's tensor-core weight gradient (kernels/conv_wgrad_mma.cu) on one
// problem: every (blocks, channel groups) variant checked against an f64 reference and timed
// back to back with CUDA events (median of 7 runs of 50 calls, each call the gradient kernel
// and the partials' sum). PyTorch's cuDNN weight gradient is timed by bench.py in the same
// call. Built on the device machine (bench/tools/conv_wgrad/run.sh):
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        -DWGRAD_MMA_THREADS=160 -DWGRAD_MMA_BLOCKS=3 bench/tools/conv_wgrad/bench.cu -o /tmp/wg
//   /tmp/wg N C K H W R S PAD GROUPS
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "common.cuh"
#include "window.cuh"
#include "conv_mma.cu"
#include "conv_wgrad_mma.cu"
#include "reference.cuh"
#include "../harness_common.cuh"


int main(int argc, char** argv) {
    if (argc < 10) { printf("usage: N C K H W R S PAD GROUPS [PARTS...]\n"); return 1; }
    const int N = atoi(argv[1]), C = atoi(argv[2]), K = atoi(argv[3]), H = atoi(argv[4]), W = atoi(argv[5]);
    const int R = atoi(argv[6]), S = atoi(argv[7]), P = atoi(argv[8]), G = atoi(argv[9]);
    Win g{};
    g.n = N; g.c = C; g.h = H; g.w = W; g.kh = R; g.kw = S; g.sh = g.sw = 1; g.ph = g.pw = P; g.dh = g.dw = 1;
    g.oh = H + 2 * P - R + 1; g.ow = W + 2 * P - S + 1;
    g.s[3] = 1; g.s[2] = W; g.s[1] = (u64)H * W; g.s[0] = (u64)C * H * W; g.offset = 0;
    const u64 nx = (u64)N * C * H * W, ny = (u64)N * K * g.oh * g.ow, nw = (u64)K * C * R * S;
    std::vector<float> hx(nx), hy(ny);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    for (auto& v : hx) v = U(rng);
    for (auto& v : hy) v = U(rng);
    // The bias gradient's reference: Σ dy per output channel, in f64 on the host.
    std::vector<double> hdb(K, 0.0), hdb_mag(K, 0.0);
    for (u64 e = 0; e < ny; ++e) {
        const int co = (int)(e / (g.oh * g.ow) % K);
        hdb[co] += hy[e];
        hdb_mag[co] += fabs(hy[e]);
    }
    float *x, *dy, *dw, *part, *bpart, *db; double *ref, *mag;
    CK(cudaMalloc(&bpart, 4096 * 1024 * 4)); CK(cudaMalloc(&db, K * 4));
    CK(cudaMalloc(&x, nx * 4)); CK(cudaMalloc(&dy, ny * 4)); CK(cudaMalloc(&dw, nw * 4));
    CK(cudaMalloc(&part, nw * 4 * 1024)); CK(cudaMalloc(&ref, nw * 8)); CK(cudaMalloc(&mag, nw * 8));
    CK(cudaMemcpy(x, hx.data(), nx * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, hy.data(), ny * 4, cudaMemcpyHostToDevice));
    wgrad_reference<<<1024, 128>>>(x, dy, ref, mag, g, K);
    CK(cudaDeviceSynchronize());
    std::vector<double> href(nw), hmag(nw);
    CK(cudaMemcpy(href.data(), ref, nw * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hmag.data(), mag, nw * 8, cudaMemcpyDeviceToHost));

    const int MT = K <= 32 ? 2 : 4, SW = S <= 3 ? 3 : S <= 5 ? 5 : 7;
    auto kern = MT == 4 ? (SW == 3 ? conv_wgrad_mma4x3_f32 : SW == 5 ? conv_wgrad_mma4x5_f32 : conv_wgrad_mma4x7_f32)
                        : (SW == 3 ? conv_wgrad_mma2x3_f32 : SW == 5 ? conv_wgrad_mma2x5_f32 : conv_wgrad_mma2x7_f32);
    std::vector<int> parts_list;
    for (int i = 10; i < argc; ++i) parts_list.push_back(atoi(argv[i]));
    if (parts_list.empty()) parts_list = {66, 99, 132};
    const int ci_blocks = (C + 8 * G - 1) / (8 * G), co_blocks = (K + 16 * MT - 1) / (16 * MT);
    for (int bh : {(int)g.oh, ((int)g.oh + 1) / 2, ((int)g.oh + 3) / 4, 7}) {
    const int npix = bh * (int)g.ow, p8 = (npix + 7) & ~7;
    WgradMma m{};
    m.bh = bh;
    m.dp = p8; while (m.dp % 8 != 4) ++m.dp;
    m.xh = (bh - 1) + (R - 1) + 1;
    m.pairs = W % 2 == 0;
    m.col0 = m.pairs ? (P + 1) / 2 * 2 : P;
    m.xw = std::max(m.col0 + W, m.col0 - P + (int)g.ow - 1 + S); m.xw += m.xw % 2;
    m.xp = m.xh * m.xw; while (m.xp % 8 != 4) ++m.xp;
    m.vec = (g.oh * g.ow) % 4 == 0 && npix % 4 == 0;
    const int CO = 16 * MT, CI = 8 * G, table = p8 + 16;
    const int smem = (2 * (CO * m.dp + CI * m.xp) + SW + 8 + table + CO) * 4;
    if (smem > 227 * 1024) { printf("bh %d: %d B of shared memory, skipped\n", bh, smem); continue; }
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, kern));
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 32 * R * G, smem));
    printf("problem b%d %d->%d %dx%d k%dx%d pad %d: MT %d SW %d G %d, bh %d dp %d xw %d xp %d pairs %d smem %d B, regs %d, spill %zu B, %d blocks/SM\n",
           N, C, K, H, W, R, S, P, MT, SW, G, bh, m.dp, m.xw, m.xp, m.pairs, smem, fa.numRegs, fa.localSizeBytes, occ);
    for (int parts : parts_list) {
        dim3 grid(parts, ci_blocks, co_blocks);
        const u64 frags = (u64)ci_blocks * co_blocks * (R * G) * MT * SW * 128;
        WgradFrag f{MT, SW, R * G, R, S, ci_blocks, (u64)C, (u64)K};
        // mode 0: the kernel alone; 1: with the partials' sum; 2: with the bias gradient too.
        const u64 bias_cols = (u64)co_blocks * 16 * MT, frag_blocks = (frags / 4 + WGRAD_SUM_COLS - 1) / WGRAD_SUM_COLS;
        auto call = [&](int mode) {
            kern<<<grid, 32 * R * G, smem>>>(x, dy, part, mode == 2 ? bpart : nullptr, g, (u64)K, m);
            if (mode == 1) conv_wgrad_mma_sum_f32<<<frag_blocks, 256>>>(part, dw, frags, parts, f, nullptr, nullptr, 0);
            if (mode == 2)
                conv_wgrad_mma_sum_f32<<<frag_blocks + (bias_cols + WGRAD_SUM_COLS - 1) / WGRAD_SUM_COLS, 256>>>(part, dw, frags, parts, f, bpart, db,
                                                                                     bias_cols);
        };
        CK(cudaMemset(dw, 0xff, nw * 4));
        CK(cudaMemset(db, 0xff, K * 4));
        call(2);
        CK(cudaDeviceSynchronize());
        std::vector<float> hw(nw);
        CK(cudaMemcpy(hw.data(), dw, nw * 4, cudaMemcpyDeviceToHost));
        double worst = 0, worst_rel = 0;
        for (u64 e = 0; e < nw; ++e) {
            const double err = fabs(hw[e] - href[e]);
            worst = std::isnan(err) ? 1e30 : std::max(worst, err / hmag[e]);
            worst_rel = std::max(worst_rel, err / std::max(fabs(href[e]), 1e-30));
        }
        std::vector<float> hb(K);
        CK(cudaMemcpy(hb.data(), db, K * 4, cudaMemcpyDeviceToHost));
        double worst_b = 0;
        for (int co = 0; co < K; ++co) {
            const double err = fabs(hb[co] - hdb[co]) / hdb_mag[co];
            worst_b = std::isnan(err) ? 1e30 : std::max(worst_b, err);
        }
        double med[3];
        for (int ws = 0; ws < 3; ++ws) med[ws] = 1000 * median_ms_back_to_back([&]() { call(ws); });
        const double flops = 2.0 * nw * N * g.oh * g.ow;
        printf("parts %4d: kernel %.1f us, with sum %.1f us (%.0f TFLOP/s), with the bias %.1f us; error max %.2e of "
               "sum|x·dy|, %.2e relative, bias %.2e of sum|dy|%s\n",
               parts, med[0], med[1], flops / med[1] * 1e-6, med[2], worst, worst_rel, worst_b,
               worst < 1e-4 && worst_b < 1e-5 ? "" : "  WRONG");
    }
    }
    CK(cudaGetLastError());
    return 0;
}
