// Standalone A/B of kiln's tensor-core weight gradient (kernels/conv_wgrad_mma.cu) on one
// problem, in one dtype (DTYPE=f32, the default, rounded to TF32; bf16 or f16, whose products
// TF32 gives exactly): every (band rows, blocks) variant checked against an f64 reference and
// timed back to back with CUDA events (median of 7 runs of 50 calls) as the kernel alone, with
// the partials' sum, and with the bias gradient too, then one call from idle with the bias as
// kiln's bench times a call. PyTorch's cuDNN weight gradient is timed by bench.py in the same
// device call. Built on the device machine (bench/tools/conv_wgrad/run.sh, run16.sh):
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        -DWGRAD_MMA_THREADS=160 -DWGRAD_MMA_BLOCKS=3 bench/tools/conv_wgrad/bench.cu -o /tmp/wg
//   [DTYPE=bf16] /tmp/wg N C K H W R S PAD GROUPS [PARTS...]
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
#include "conv_wgrad_mma.cu"
#include "reference.cuh"
#include "../harness_common.cuh"

typedef void (*WgradK)(const void*, const void*, float*, float*, Win, u64, WgradMma);
// kiln's kernels for dtype T by [MT == 4 ? 0 : 1][SW 3, 5, 7].
template <typename T> struct Kernels;
#define WGRAD_TABLE(T, NAME)                                                                              \
    template <> struct Kernels<T> {                                                                     \
        static WgradK pick(int mt, int sw) {                                                            \
            void (*k[2][3])(const T*, const T*, float*, float*, Win, u64, WgradMma) = {                 \
                {conv_wgrad_mma4x3_##NAME, conv_wgrad_mma4x5_##NAME, conv_wgrad_mma4x7_##NAME},         \
                {conv_wgrad_mma2x3_##NAME, conv_wgrad_mma2x5_##NAME, conv_wgrad_mma2x7_##NAME}};        \
            return reinterpret_cast<WgradK>(k[mt == 4 ? 0 : 1][sw == 3 ? 0 : sw == 5 ? 1 : 2]);          \
        }                                                                                               \
    };
WGRAD_TABLE(float, f32)
WGRAD_TABLE(bf16, bf16)
WGRAD_TABLE(f16, f16)

template <typename T>
__global__ void narrow_to(const float* in, T* out, u64 n) {
    GRID_LOOP(i, n) out[i] = from_c<T>(in[i]);
}

template <typename T>
static int run(const char* name, int argc, char** argv) {
    const int N = atoi(argv[1]), C = atoi(argv[2]), K = atoi(argv[3]), H = atoi(argv[4]), W = atoi(argv[5]);
    const int R = atoi(argv[6]), S = atoi(argv[7]), P = atoi(argv[8]), G = atoi(argv[9]);
    // TF32 products round; 16-bit ones are exact, so only the f32 sums' order is left.
    const double tol = sizeof(T) == 4 ? 1e-4 : 1e-5;
    Win g{};
    g.n = N; g.c = C; g.h = H; g.w = W; g.kh = R; g.kw = S; g.sh = g.sw = 1; g.ph = g.pw = P; g.dh = g.dw = 1;
    g.oh = H + 2 * P - R + 1; g.ow = W + 2 * P - S + 1;
    g.s[3] = 1; g.s[2] = W; g.s[1] = (u64)H * W; g.s[0] = (u64)C * H * W; g.offset = 0;
    const u64 nx = (u64)N * C * H * W, ny = (u64)N * K * g.oh * g.ow, nw = (u64)K * C * R * S;
    // Random operands made on the host in f32, narrowed to T on the device.
    std::vector<float> hx(nx), hy(ny);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    for (auto& v : hx) v = U(rng);
    for (auto& v : hy) v = U(rng);
    T *x, *dy;
    float *stage, *dw, *part, *bpart, *db;
    double *ref, *mag, *bref, *bmag;
    CK(cudaMalloc(&x, nx * sizeof(T))); CK(cudaMalloc(&dy, ny * sizeof(T))); CK(cudaMalloc(&stage, std::max(nx, ny) * 4));
    CK(cudaMalloc(&dw, nw * 4)); CK(cudaMalloc(&part, nw * 4 * 1024));
    CK(cudaMalloc(&bpart, 4096 * 1024 * 4)); CK(cudaMalloc(&db, K * 4));
    CK(cudaMalloc(&ref, nw * 8)); CK(cudaMalloc(&mag, nw * 8)); CK(cudaMalloc(&bref, K * 8)); CK(cudaMalloc(&bmag, K * 8));
    CK(cudaMemcpy(stage, hx.data(), nx * 4, cudaMemcpyHostToDevice));
    narrow_to<<<512, 256>>>(stage, x, nx);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(stage, hy.data(), ny * 4, cudaMemcpyHostToDevice));
    narrow_to<<<512, 256>>>(stage, dy, ny);
    wgrad_reference<<<1024, 128>>>(x, dy, ref, mag, g, K);
    bias_reference<<<K, 128>>>(dy, bref, bmag, g, K);
    CK(cudaDeviceSynchronize());
    std::vector<double> href(nw), hmag(nw), hdb(K), hdb_mag(K);
    CK(cudaMemcpy(href.data(), ref, nw * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hmag.data(), mag, nw * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdb.data(), bref, K * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdb_mag.data(), bmag, K * 8, cudaMemcpyDeviceToHost));

    const int MT = K <= 32 ? 2 : 4, SW = S <= 3 ? 3 : S <= 5 ? 5 : 7;
    const WgradK kern = Kernels<T>::pick(MT, SW);
    std::vector<int> parts_list;
    for (int i = 10; i < argc; ++i) parts_list.push_back(atoi(argv[i]));
    if (parts_list.empty()) parts_list = {66, 99, 132};
    const int ci_blocks = (C + 8 * G - 1) / (8 * G), co_blocks = (K + 16 * MT - 1) / (16 * MT);
    int fails = 0;
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
        const int CO = 16 * MT, CI = 8 * G, table = p8 + 16, stage_words = CO * m.dp + CI * m.xp;
        const int smem = (2 * stage_words + SW + 8 + table + CO) * 4;
        if (smem > 227 * 1024) { printf("bh %d: %d B of shared memory, skipped\n", bh, smem); continue; }
        // The 16-bit stages' copies move 16 bytes at a time.
        if (sizeof(T) == 2 && stage_words % 8) { printf("bh %d: stage of %d words, skipped\n", bh, stage_words); continue; }
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, kern));
        int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 32 * R * G, smem));
        printf("%s b%d %d->%d %dx%d k%dx%d pad %d: MT %d SW %d G %d, bh %d dp %d xw %d xp %d pairs %d smem %d B, regs %d, spill %zu B, %d blocks/SM\n",
               name, N, C, K, H, W, R, S, P, MT, SW, G, bh, m.dp, m.xw, m.xp, m.pairs, smem, fa.numRegs, fa.localSizeBytes, occ);
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
                    conv_wgrad_mma_sum_f32<<<frag_blocks + (bias_cols + WGRAD_SUM_COLS - 1) / WGRAD_SUM_COLS, 256>>>(
                        part, dw, frags, parts, f, bpart, db, bias_cols);
            };
            CK(cudaMemset(dw, 0xff, nw * 4));
            CK(cudaMemset(db, 0xff, K * 4));
            call(2);
            CK(cudaDeviceSynchronize());
            std::vector<float> hw(nw), hb(K);
            CK(cudaMemcpy(hw.data(), dw, nw * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hb.data(), db, K * 4, cudaMemcpyDeviceToHost));
            double worst = 0, worst_rel = 0, worst_b = 0;
            for (u64 e = 0; e < nw; ++e) {
                const double err = fabs(hw[e] - href[e]);
                worst = std::isnan(err) ? 1e30 : std::max(worst, err / hmag[e]);
                worst_rel = std::max(worst_rel, err / std::max(fabs(href[e]), 1e-30));
            }
            for (int co = 0; co < K; ++co) {
                const double err = fabs(hb[co] - hdb[co]) / hdb_mag[co];
                worst_b = std::isnan(err) ? 1e30 : std::max(worst_b, err);
            }
            double med[3];
            for (int ws = 0; ws < 3; ++ws) med[ws] = 1000 * median_ms_back_to_back([&]() { call(ws); });
            const double one = 1000 * median_ms_from_idle([&]() { call(2); });
            const double flops = 2.0 * nw * N * g.oh * g.ow;
            const bool bad = !(worst < tol && worst_b < 1e-5);
            fails += bad;
            printf("%s parts %4d: kernel %.1f us, with sum %.1f us (%.0f TFLOP/s), with the bias %.1f us, from idle %.1f us; "
                   "error max %.2e of sum|x·dy|, %.2e relative, bias %.2e of sum|dy|%s\n",
                   name, parts, med[0], med[1], flops / med[1] * 1e-6, med[2], one, worst, worst_rel, worst_b,
                   bad ? "  WRONG" : "");
        }
    }
    CK(cudaGetLastError());
    cudaFree(x); cudaFree(dy); cudaFree(stage); cudaFree(dw); cudaFree(part); cudaFree(bpart); cudaFree(db);
    cudaFree(ref); cudaFree(mag); cudaFree(bref); cudaFree(bmag);
    return fails;
}

int main(int argc, char** argv) {
    if (argc < 10) { printf("usage: [DTYPE=f32|bf16|f16] N C K H W R S PAD GROUPS [PARTS...]\n"); return 1; }
    const char* dt = getenv("DTYPE");
    const int fails = !dt || !strcmp(dt, "f32") ? run<float>("f32", argc, argv)
                      : !strcmp(dt, "bf16")      ? run<bf16>("bf16", argc, argv)
                      : !strcmp(dt, "f16")       ? run<f16>("f16", argc, argv)
                                                 : (printf("DTYPE %s: f32, bf16 or f16\n", dt), 1);
    return fails != 0;
}
