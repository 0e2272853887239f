// Standalone timing of kiln's few-output-channel convolution (kernels/conv_few.cu) over its
// launch shapes, on the problems it is for: the input gradient of b256 1→32 28² 5×5 (a 32→1
// convolution of the output gradient, filter flipped) and of b1 3→64 224² 3×3 (64→3), in f32
// and bf16. Each plan is checked against an f64 reference on a sample of outputs and timed
// back to back with CUDA events (median of 7 runs of 50 launches). Built on the device machine:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_few/harness.cu -o /tmp/conv_few && /tmp/conv_few
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "common.cuh"
#include "window.cuh"
#include "conv_few.cu"
#include "../harness_common.cuh"


// The input gradient's problem: `c` channels of the output gradient into `co` channels.
struct Prob {
    const char* name;
    int n, c, h, w, co, k, pad;
};

// FEW_MINB: blocks an SM should hold (the launch bound's second argument), to try register caps.
#ifndef FEW_MINB
#define FEW_MINB 1
#endif
template <typename T, int K, int CO>
__global__ void __launch_bounds__(256, FEW_MINB) few(const T* x, const T* w, T* y, Win g, int c_out, int flip, const T* bias,
                                           int relu, int cgx, int rgy, int split, int ck, int pitch) {
    conv_few_impl<T, K, CO>(x, w, y, g, c_out, flip, bias, relu, cgx, rgy, split, ck, pitch);
}

// `ONLY=split,cpg` in the environment runs that launch shape alone (for ncu).
static bool wanted(int split, int cpg) {
    const char* only = getenv("ONLY");
    if (!only) return true;
    int s = 0, c = 0;
    return sscanf(only, "%d,%d", &s, &c) == 2 && s == split && c == cpg;
}

template <typename T, int K, int CO>
static void run(const Prob& p, const char* tname) {
    const int oh = p.h, ow = p.w;  // stride 1, "same" padding
    const size_t nx = (size_t)p.n * p.c * p.h * p.w, nw = (size_t)p.c * p.co * K * K;
    const size_t ny = (size_t)p.n * p.co * oh * ow;
    std::vector<T> hx(nx), hw(nw);
    std::vector<float> fx(nx), fw(nw);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    for (size_t i = 0; i < nx; ++i) { hx[i] = round_to<T>(nd(rng)); fx[i] = widen(hx[i]); }
    for (size_t i = 0; i < nw; ++i) { hw[i] = round_to<T>(nd(rng) * 0.1f); fw[i] = widen(hw[i]); }
    T *dx, *dw, *dy;
    CK(cudaMalloc(&dx, nx * sizeof(T)));
    CK(cudaMalloc(&dw, nw * sizeof(T)));
    CK(cudaMalloc(&dy, ny * sizeof(T)));
    CK(cudaMemcpy(dx, hx.data(), nx * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), nw * sizeof(T), cudaMemcpyHostToDevice));
    Win g{};
    g.n = p.n; g.c = p.c; g.h = p.h; g.w = p.w; g.oh = oh; g.ow = ow;
    g.kh = K; g.kw = K; g.sh = 1; g.sw = 1; g.ph = p.pad; g.pw = p.pad; g.dh = 1; g.dw = 1;
    g.s[0] = (u64)p.c * p.h * p.w; g.s[1] = (u64)p.h * p.w; g.s[2] = p.w; g.s[3] = 1; g.offset = 0;
    const double flops = 2.0 * ny * p.c * K * K;
    const int full = std::min((oh + 3) / 4, 8), cgx = std::min((ow + 3) / 4, 8);
    std::vector<T> hy(ny);
    auto fn = few<T, K, CO>;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    for (int rgy : {full, (full + 1) / 2}) {
        for (int split : {1, 2, 4, 8}) {
            for (int cpg : {2, 4, 8}) {
                if (cgx * rgy * split > 256 || split * cpg > 2 * p.c || !wanted(split, cpg)) continue;
                const int window = (4 + K - 1 + 3) / 4 * 4, pitch = 4 * cgx + window - 4;
                const int rows = 4 * rgy + K - 1, ck = std::min(split * cpg, (p.c + split - 1) / split * split);
                const int ws = (K * K * CO + 3) / 4 * 4;
                const size_t elem = sizeof(typename Compute<T>::type);
                const size_t smem = std::max((size_t)ck * rows * pitch + (size_t)ck * ws,
                                             (size_t)(split - 1) * CO * 16 * cgx * rgy) * elem;
                if (smem > 200 * 1024) continue;
                const int blocks = p.n * ((oh + 4 * rgy - 1) / (4 * rgy)) * ((ow + 4 * cgx - 1) / (4 * cgx));
                auto launch = [&] {
                    fn<<<blocks, cgx * rgy * split, smem>>>(dx, dw, dy, g, p.co, 1, nullptr, 0, cgx, rgy, split, ck,
                                                           pitch);
                };
                launch();
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hy.data(), dy, ny * sizeof(T), cudaMemcpyDeviceToHost));
                // A sample of outputs against the f64 sum (the filter transposed and mirrored).
                double err = 0, norm = 0;
                std::mt19937 pick(3);
                for (int s = 0; s < 2000; ++s) {
                    const size_t i = pick() % ny;
                    const int x0 = i % ow, y0 = (i / ow) % oh, o = (i / ((size_t)ow * oh)) % p.co;
                    const int b = i / ((size_t)ow * oh * p.co);
                    double want = 0;
                    for (int c = 0; c < p.c; ++c)
                        for (int ky = 0; ky < K; ++ky)
                            for (int kx = 0; kx < K; ++kx) {
                                const int iy = y0 - p.pad + ky, ix = x0 - p.pad + kx;
                                if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                                want += (double)fx[(((size_t)b * p.c + c) * p.h + iy) * p.w + ix] *
                                        fw[((size_t)c * p.co + o) * K * K + (K - 1 - ky) * K + (K - 1 - kx)];
                            }
                    const double got = widen(hy[i]);
                    err += (got - want) * (got - want);
                    norm += want * want;
                }
                cudaEvent_t a, z;
                CK(cudaEventCreate(&a));
                CK(cudaEventCreate(&z));
                std::vector<float> ms;
                for (int r = 0; r < 7; ++r) {
                    CK(cudaEventRecord(a));
                    for (int i = 0; i < 50; ++i) launch();
                    CK(cudaEventRecord(z));
                    CK(cudaEventSynchronize(z));
                    float t;
                    CK(cudaEventElapsedTime(&t, a, z));
                    ms.push_back(t / 50);
                }
                std::sort(ms.begin(), ms.end());
                printf("%-18s %-4s tile %2dx%2d split %d ck %2d threads %3d smem %6zu: %.4f ms %6.2f TFLOP/s rel err %.1e\n",
                       p.name, tname, 4 * rgy, 4 * cgx, split, ck, cgx * rgy * split, smem, ms[3],
                       flops / ms[3] / 1e9, std::sqrt(err / norm));
            }
        }
    }
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(dy));
}

int main() {
    const Prob mnist{"b256 32->1 28 k5", 256, 32, 28, 28, 1, 5, 2};
    const Prob rgb{"b1 64->3 224 k3", 1, 64, 224, 224, 3, 3, 1};
    run<float, 5, 1>(mnist, "f32");
    run<bf16, 5, 1>(mnist, "bf16");
    run<float, 3, 3>(rgb, "f32");
    run<bf16, 3, 3>(rgb, "bf16");
    return 0;
}
