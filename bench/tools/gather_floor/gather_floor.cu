// The floor under a CSR SpMV of the `sparse` suite's random16 matrix (issue 11): what the GPU
// takes to do only the gathers such a product must do, with nothing else in the way.
//   nvcc -O3 -arch=sm_90 -o /tmp/gather_floor bench/tools/gather_floor/gather_floor.cu && /tmp/gather_floor
// Rows (µs, median of 31 event-timed launches after 5 warm-up; 2^20 rows):
//   gather_only K    K random 4-byte reads of a 4 MB x per row (indices hashed in registers,
//                    no index stream), one sum written per row: the L2 sector traffic alone
//   ell_spmv 16      the random16 product in the best layout for the GPU (ELL, column-major,
//                    every load of col_idx and values coalesced): streams plus gathers
//   stream_only 16   the same streams read and summed without any gather: the DRAM part
//   copy             a 1 GiB device-to-device copy: the bandwidth everything is quoted against
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
typedef unsigned int u32;

__device__ __forceinline__ u32 hash32(u32 x) {  // murmur3's finaliser
    x ^= x >> 16; x *= 0x85ebca6bu; x ^= x >> 13; x *= 0xc2b2ae35u; x ^= x >> 16; return x;
}

template <int K>
__global__ void gather_only(const float* __restrict__ x, u32 n, float* y, u32 rows) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) s += __ldg(x + (hash32(r * 64u + j) & (n - 1)));
    y[r] = s;
}

__global__ void ell_spmv(const u32* __restrict__ ci, const float* __restrict__ v, const float* __restrict__ x,
                         float* y, u32 rows, int k) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float s = 0.f;
#pragma unroll 16
    for (int j = 0; j < k; ++j) { size_t e = (size_t)j * rows + r; s += v[e] * __ldg(x + ci[e]); }
    y[r] = s;
}

__global__ void stream_only(const u32* __restrict__ ci, const float* __restrict__ v, float* y, u32 rows, int k) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float s = 0.f;
#pragma unroll 16
    for (int j = 0; j < k; ++j) { size_t e = (size_t)j * rows + r; s += v[e] * (float)(ci[e] & 1u); }
    y[r] = s;
}

template <class F> static double median_us(F launch) {
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int i = 0; i < 5; ++i) launch();
    std::vector<float> t;
    for (int i = 0; i < 31; ++i) {
        CK(cudaEventRecord(a)); launch(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1e3f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    const u32 n = 1u << 20, rows = n, k = 16;
    const size_t nnz = (size_t)rows * k;
    float *x, *y, *v; u32* ci;
    CK(cudaMalloc(&x, n * 4)); CK(cudaMalloc(&y, rows * 4)); CK(cudaMalloc(&v, nnz * 4)); CK(cudaMalloc(&ci, nnz * 4));
    std::vector<float> hx(n); std::vector<u32> hc(nnz); std::vector<float> hv(nnz);
    u32 s = 12345;
    auto next = [&]() { s ^= s << 13; s ^= s >> 17; s ^= s << 5; return s; };
    for (auto& e : hx) e = (next() % 2001) / 1000.f - 1.f;
    for (size_t e = 0; e < nnz; ++e) { hc[e] = next() & (n - 1); hv[e] = (next() % 2001) / 1000.f - 1.f; }
    CK(cudaMemcpy(x, hx.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ci, hc.data(), nnz * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), nnz * 4, cudaMemcpyHostToDevice));
    dim3 grid((rows + 255) / 256), block(256);
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, L2 %d MB\n", p.name, p.l2CacheSize >> 20);
    double t8 = median_us([&] { gather_only<8><<<grid, block>>>(x, n, y, rows); });
    double t12 = median_us([&] { gather_only<12><<<grid, block>>>(x, n, y, rows); });
    double t16 = median_us([&] { gather_only<16><<<grid, block>>>(x, n, y, rows); });
    double te = median_us([&] { ell_spmv<<<grid, block>>>(ci, v, x, y, rows, k); });
    double ts = median_us([&] { stream_only<<<grid, block>>>(ci, v, y, rows, k); });
    printf("gather_only 8    %8.1f us  (%.2f G gathers/s)\n", t8, 8.0 * rows / t8 / 1e3);
    printf("gather_only 12   %8.1f us  (%.2f G gathers/s)\n", t12, 12.0 * rows / t12 / 1e3);
    printf("gather_only 16   %8.1f us  (%.2f G gathers/s; 32-byte sectors: %.0f GB/s)\n", t16, 16.0 * rows / t16 / 1e3, 32.0 * 16 * rows / t16 / 1e3);
    printf("ell_spmv 16      %8.1f us  (%.0f GB/s of streams, row_ptr-free)\n", te, 8.0 * nnz / te / 1e3);
    printf("stream_only 16   %8.1f us  (%.0f GB/s)\n", ts, 8.0 * nnz / ts / 1e3);
    size_t big = 1ull << 30; void *a, *b; CK(cudaMalloc(&a, big)); CK(cudaMalloc(&b, big));
    double tc = median_us([&] { CK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice)); });
    printf("copy 1 GiB       %8.1f us  (%.0f GB/s read + write)\n", tc, 2.0 * big / tc / 1e3);
    return 0;
}
