// Standalone A/B of a convolution's bias gradient (the sum of [n, c, h, w] over (0, 2, 3)):
// kiln's two launches (reduce_planes + reduce_parts, kernels/reduce.cu, as cuda/reduce.rs
// launches them) against one launch whose last block per channel folds the partials in a
// fixed order. Both checked against an f64 sum; timed with events back to back (median of
// 7 runs of 50) and one call from idle (median of 31), on one buffer (L2-resident) and
// rotating over four. Built on the device machine:
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/plane_sums/bench.cu -o /tmp/plane_sums && /tmp/plane_sums
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>
#include "common.cuh"
#include "reduce.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(2); } } while (0)

// Grid (kept, splits), 256 threads. Warps take whole planes (planes under 1024 elements),
// two at a time so each lane has two 16-byte loads in flight per plane row; the block's sum
// goes to part[c * splits + s]; the block that finishes channel c last (a counter per
// channel) adds the partials in order 0..splits and resets the counter.
template <int UNROLL>
__global__ void plane_sums_once(const float* x, u64 outer, u64 kept, u64 inner, float* part, unsigned* done, float* out) {
    const u64 c = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const u64 step = splits * warps;
    float acc = 0.f;
    const u64 nv = inner / 4;
    for (u64 b0 = s * warps + warp; b0 < outer; b0 += step * UNROLL) {
        float4 v[UNROLL][2];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            u64 b = b0 + u * step;
            const float4* plane = reinterpret_cast<const float4*>(x + (b * kept + c) * inner);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                u64 j = lane + 32 * k;
                v[u][k] = (b < outer && j < nv) ? plane[j] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < 2; ++k) acc += (v[u][k].x + v[u][k].y) + (v[u][k].z + v[u][k].w);
        // Planes longer than 64 vectors: the rest one by one.
        for (u64 j = 64 + lane; j < nv; j += 32)
            for (int u = 0; u < UNROLL; ++u) {
                u64 b = b0 + u * step;
                if (b < outer) { float4 q = reinterpret_cast<const float4*>(x + (b * kept + c) * inner)[j]; acc += (q.x + q.y) + (q.z + q.w); }
            }
    }
    __shared__ float sw[32];
    __shared__ bool last;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (lane == 0) sw[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < warps; ++w) t += sw[w];
        part[c * splits + s] = t;
        __threadfence();
        last = atomicAdd(&done[c], 1u) == splits - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        float t = 0.f;
        for (u64 k = 0; k < splits; ++k) t += ((volatile float*)part)[c * splits + k];
        out[c] = t;
        done[c] = 0;
    }
}

int main() {
    const u64 n = 256, c = 64, hw = 196, len = n * c * hw;
    std::vector<float> h(len);
    unsigned st = 12345;
    for (auto& v : h) { st = st * 1664525u + 1013904223u; v = ((st >> 8) / 16777216.0f) * 2.f - 1.f; }
    std::vector<double> want(c, 0.0);
    for (u64 b = 0; b < n; ++b) for (u64 k = 0; k < c; ++k) for (u64 j = 0; j < hw; ++j) want[k] += h[(b * c + k) * hw + j];
    float* xs[4];
    for (auto& p : xs) { CK(cudaMalloc(&p, len * 4)); CK(cudaMemcpy(p, h.data(), len * 4, cudaMemcpyHostToDevice)); }
    int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const u64 splits_old = std::min<u64>(std::max<u64>((4 * sms + c - 1) / c, 1), std::min<u64>(n, 1024));
    float *pv, *out; i64* pi; unsigned* done;
    CK(cudaMalloc(&pv, 4096 * 4)); CK(cudaMalloc(&pi, 4096 * 8)); CK(cudaMalloc(&out, c * 4)); CK(cudaMalloc(&done, c * 4));
    CK(cudaMemset(done, 0, c * 4));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto check = [&](const char* name) {
        std::vector<float> got(c); CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got.data(), out, c * 4, cudaMemcpyDeviceToHost));
        double worst = 0; for (u64 k = 0; k < c; ++k) worst = std::max(worst, fabs(got[k] - want[k]) / (1e-6 * 50176));
        printf("%-28s worst error %.3f of 1e-6 x terms\n", name, worst);
        return worst < 1.0;
    };
    auto timed = [&](auto f, bool rotate) {
        std::vector<float> ms; int at = 0;
        for (int i = 0; i < 5; ++i) f(xs[0]);
        for (int r = 0; r < 7; ++r) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 50; ++i) f(xs[rotate ? (at++ & 3) : 0]);
            CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
            float t; CK(cudaEventElapsedTime(&t, e0, e1)); ms.push_back(t * 1000 / 50);
        }
        std::sort(ms.begin(), ms.end());
        std::vector<float> one;
        for (int r = 0; r < 31; ++r) {
            CK(cudaDeviceSynchronize()); CK(cudaEventRecord(e0)); f(xs[0]); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
            float t; CK(cudaEventElapsedTime(&t, e0, e1)); one.push_back(t * 1000);
        }
        std::sort(one.begin(), one.end());
        return std::make_pair(ms[3], one[15]);
    };
    bool ok = true;
    auto old = [&](float* x) {
        reduce_planes_f32<<<dim3(c, splits_old), 256>>>(x, n, c, hw, R_SUM, 1, pv, pi);
        reduce_parts_f32<<<c, 256>>>(pv, pi, splits_old, R_SUM, out, nullptr);
    };
    old(xs[0]); ok &= check("kiln (planes + parts)");
    for (bool rot : {false, true}) {
        auto t = timed(old, rot);
        printf("  kiln splits %llu %s: %.2f us back to back, %.2f from idle\n", (unsigned long long)splits_old, rot ? "rotating 4 buffers" : "one buffer", t.first, t.second);
    }
    for (u64 splits : {4ull, 8ull, 12ull, 16ull}) {
        for (int unroll : {1, 2, 4}) {
            auto f = [&](float* x) {
                if (unroll == 1) plane_sums_once<1><<<dim3(c, splits), 256>>>(x, n, c, hw, pv, done, out);
                if (unroll == 2) plane_sums_once<2><<<dim3(c, splits), 256>>>(x, n, c, hw, pv, done, out);
                if (unroll == 4) plane_sums_once<4><<<dim3(c, splits), 256>>>(x, n, c, hw, pv, done, out);
            };
            CK(cudaMemset(out, 0, c * 4)); f(xs[0]);
            char name[64]; snprintf(name, 64, "once splits %llu unroll %d", (unsigned long long)splits, unroll);
            ok &= check(name);
            auto a = timed(f, false), b = timed(f, true);
            printf("  %.2f us back to back (%.2f rotating), %.2f from idle\n", a.first, b.first, a.second);
        }
    }
    printf("plane sums: %s\n", ok ? "all correct" : "MISMATCH");
    return ok ? 0 : 1;
}
