// Sparse-product lab (issue 11): kiln's CUDA SpMV/SpMM kernels beside variants and cuSPARSE,
// on the `sparse` suite's three matrices (same hash as crates/kiln-bench/src/sparse.rs), timed
// with events (median of 25 after warm-up) and checked against a host f64 reference.
// Build and run on the GPU machine: `bash bench/tools/sparse_lab/run.sh` (nvcc there).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include <cusparse.h>

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
#define CS(x) do { cusparseStatus_t e = (x); if (e != CUSPARSE_STATUS_SUCCESS) { printf("cuSPARSE %d at %d\n", (int)e, __LINE__); exit(1); } } while (0)

#define LONG_ROW 64
#define PIECE 256

static u64 mix(u64 x) {
    u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void bench_matrix(const char* kind, u64 n, std::vector<u32>& rp, std::vector<u32>& ci) {
    rp.assign(1, 0);
    ci.clear();
    for (u64 i = 0; i < n; ++i) {
        u64 deg;
        if (!strcmp(kind, "cycle")) deg = 1;
        else if (!strcmp(kind, "random16")) deg = 16;
        else {
            double u = (double)((mix(0xD0 ^ i) >> 11) + 1) * (1.0 / (double)(1ull << 53));
            deg = std::min((u64)floor(4.0 * pow(u, -2.0 / 3.0)), n / 8);
        }
        size_t start = ci.size();
        for (u64 j = 0; j < deg; ++j)
            ci.push_back(!strcmp(kind, "cycle") ? (u32)((i + 1) % n) : (u32)(mix(0xC0 ^ (i << 24 | j)) % n));
        std::sort(ci.begin() + start, ci.end());
        rp.push_back((u32)ci.size());
    }
}

__device__ __forceinline__ float sum_lanes(float v, u32 lanes) {
    for (u32 off = lanes / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, (int)off);
    return v;
}

// ---- SpMV ------------------------------------------------------------------------------
// kiln's kernel today (sparse.cu spmv_rows_impl, beta = 0, alpha = 1).
__global__ void spmv_kiln(const u32* __restrict__ rp, const u32* __restrict__ ci, const float* __restrict__ v,
                          const float* __restrict__ x, float* y, u64 rows, u32 lanes) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / lanes;
    u32 lane = (u32)(t % lanes);
    u64 s = 0, e = 0;
    if (row < rows) { s = rp[row]; e = rp[row + 1]; }
    bool is_long = e - s > LONG_ROW;
    float sum = 0;
    if (!is_long)
        for (u64 k = s + lane; k < e; k += lanes) sum += v[k] * x[ci[k]];
    sum = sum_lanes(sum, lanes);
    if (row < rows && lane == 0 && !is_long) y[row] = sum;
}

// The same with streaming (evict-first) loads of the matrix and 4 entries in flight per lane.
__global__ void spmv_stream(const u32* __restrict__ rp, const u32* __restrict__ ci, const float* __restrict__ v,
                            const float* __restrict__ x, float* y, u64 rows, u32 lanes) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / lanes;
    u32 lane = (u32)(t % lanes);
    u32 s = 0, e = 0;
    if (row < rows) { s = __ldcs(rp + row); e = __ldcs(rp + row + 1); }
    bool is_long = e - s > LONG_ROW;
    float sum = 0;
    if (!is_long) {
        u32 k = s + lane;
        for (; k + 3 * lanes < e; k += 4 * lanes) {
            u32 c0 = __ldcs(ci + k), c1 = __ldcs(ci + k + lanes), c2 = __ldcs(ci + k + 2 * lanes), c3 = __ldcs(ci + k + 3 * lanes);
            float v0 = __ldcs(v + k), v1 = __ldcs(v + k + lanes), v2 = __ldcs(v + k + 2 * lanes), v3 = __ldcs(v + k + 3 * lanes);
            sum += v0 * __ldg(x + c0) + v1 * __ldg(x + c1) + v2 * __ldg(x + c2) + v3 * __ldg(x + c3);
        }
        for (; k < e; k += lanes) sum += __ldcs(v + k) * __ldg(x + __ldcs(ci + k));
    }
    sum = sum_lanes(sum, lanes);
    if (row < rows && lane == 0 && !is_long) y[row] = sum;
}

__global__ void spmv_pieces(const i64* __restrict__ pieces, u64 np, const u32* __restrict__ ci, const float* __restrict__ v,
                            const float* __restrict__ x, float* partial) {
    u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    u32 lane = threadIdx.x % 32;
    float sum = 0;
    if (p < np) {
        u64 s = pieces[3 * p + 1], e = pieces[3 * p + 2];
        for (u64 k = s + lane; k < e; k += 32) sum += v[k] * x[ci[k]];
    }
    sum = sum_lanes(sum, 32);
    if (p < np && lane == 0) partial[p] = sum;
}

// ---- SpMM (n = 64, row-major X with ld 64) ----------------------------------------------
__device__ __forceinline__ u64 warp_max(u64 v) {
    for (int off = 16; off > 0; off /= 2) v = max(v, (u64)__shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// kiln's kernel today (mm_range + spmm_rows_impl).
__global__ void spmm_kiln(const u32* __restrict__ rp, const u32* __restrict__ ci, const float* __restrict__ v,
                          const float* __restrict__ x, u64 ldx, u64 n, float* y, u64 rows, u32 G) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / G;
    u32 g = (u32)(t % G);
    u64 s = 0, len = 0;
    bool mine = false;
    if (row < rows) {
        s = rp[row];
        len = rp[row + 1] - s;
        mine = len <= LONG_ROW;
        if (!mine) len = 0;
    }
    u64 j0 = (u64)blockIdx.y * 4 * G;
    float acc[4] = {0, 0, 0, 0};
    u64 longest = warp_max(len);
    for (u64 kb = 0; kb < longest; kb += G) {
        u64 my_c = 0;
        float my_v = 0;
        if (kb + g < len) { my_c = ci[s + kb + g]; my_v = v[s + kb + g]; }
        u32 cnt = (u32)min((u64)G, longest - kb);
        for (u32 i = 0; i < cnt; ++i) {
            u64 c = __shfl_sync(0xffffffffu, my_c, (int)i, (int)G);
            float w = __shfl_sync(0xffffffffu, my_v, (int)i, (int)G);
            if (kb + i < len) {
                const float* xr = x + c * ldx + j0 + g;
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (j0 + g + (u64)G * j < n) acc[j] += w * xr[(u64)G * j];
            }
        }
    }
    if (!mine) return;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u64 col = j0 + g + (u64)G * j;
        if (col < n) y[row * n + col] = acc[j];
    }
}

// Panel kernel: G lanes per row, each a float4 of columns j0 + 4g; a panel of W = 4G columns
// per blockIdx.y (the slow grid axis, so one panel of X is gathered at a time and stays in
// L2). Every lane of the group reads the row's (column, value) pairs itself (one transaction
// per group); STREAM picks evict-first loads for the matrix.
template <bool STREAM>
__global__ void spmm_panel(const u32* __restrict__ rp, const u32* __restrict__ ci, const float* __restrict__ v,
                           const float* __restrict__ x, u64 ldx, float* y, u64 ldy, u64 rows, u32 G) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 row = t / G;
    u32 g = (u32)(t % G);
    if (row >= rows) return;
    u32 s = STREAM ? __ldcs(rp + row) : rp[row], e = STREAM ? __ldcs(rp + row + 1) : rp[row + 1];
    if (e - s > LONG_ROW) return;
    u64 col = (u64)blockIdx.y * 4 * G + 4 * g;
    const float* xc = x + col;
    float4 acc = make_float4(0, 0, 0, 0);
    u32 k = s;
    for (; k + 4 <= e; k += 4) {
        u32 c[4];
        float w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            c[i] = STREAM ? __ldcs(ci + k + i) : ci[k + i];
            w[i] = STREAM ? __ldcs(v + k + i) : v[k + i];
        }
        float4 xv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[i] = __ldg((const float4*)(xc + (u64)c[i] * ldx));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc.x += w[i] * xv[i].x; acc.y += w[i] * xv[i].y; acc.z += w[i] * xv[i].z; acc.w += w[i] * xv[i].w;
        }
    }
    for (; k < e; ++k) {
        u32 c = STREAM ? __ldcs(ci + k) : ci[k];
        float w = STREAM ? __ldcs(v + k) : v[k];
        float4 xv = __ldg((const float4*)(xc + (u64)c * ldx));
        acc.x += w * xv.x; acc.y += w * xv.y; acc.z += w * xv.z; acc.w += w * xv.w;
    }
    *(float4*)(y + row * ldy + col) = acc;
}

// Long-row pieces, panel form: a warp per (piece, panel); 32/G groups split the entries.
__global__ void spmm_panel_pieces(const i64* __restrict__ pieces, u64 np, const u32* __restrict__ ci,
                                  const float* __restrict__ v, const float* __restrict__ x, u64 ldx, u64 n,
                                  float* partial, u32 G) {
    u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    u32 lane = threadIdx.x % 32;
    if (p >= np) return;
    u32 g = lane % G, sub = lane / G, subs = 32 / G;
    u64 col = (u64)blockIdx.y * 4 * G + 4 * g;
    float4 acc = make_float4(0, 0, 0, 0);
    u64 s = pieces[3 * p + 1], e = pieces[3 * p + 2];
    for (u64 k = s + sub; k < e; k += subs) {
        float w = v[k];
        float4 xv = __ldg((const float4*)(x + (u64)ci[k] * ldx + col));
        acc.x += w * xv.x; acc.y += w * xv.y; acc.z += w * xv.z; acc.w += w * xv.w;
    }
    for (u32 off = G; off < 32; off *= 2) {
        acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
        acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
        acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off);
        acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off);
    }
    if (sub == 0) *(float4*)(partial + p * n + col) = acc;
}

// kiln's piece kernel for SpMM (warp per piece, 128 columns a tile).
__global__ void spmm_kiln_pieces(const i64* __restrict__ pieces, u64 np, const u32* __restrict__ ci,
                                 const float* __restrict__ v, const float* __restrict__ x, u64 ldx, u64 n,
                                 float* partial) {
    u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    u32 lane = threadIdx.x % 32;
    if (p >= np) return;
    u64 j0 = (u64)blockIdx.y * 128;
    float acc[4] = {0, 0, 0, 0};
    u64 s = pieces[3 * p + 1], len = pieces[3 * p + 2] - s;
    for (u64 kb = 0; kb < len; kb += 32) {
        u64 my_c = 0;
        float my_v = 0;
        if (kb + lane < len) { my_c = ci[s + kb + lane]; my_v = v[s + kb + lane]; }
        u32 cnt = (u32)min((u64)32, len - kb);
        for (u32 i = 0; i < cnt; ++i) {
            u64 c = __shfl_sync(0xffffffffu, my_c, (int)i);
            float w = __shfl_sync(0xffffffffu, my_v, (int)i);
            const float* xr = x + c * ldx + j0 + lane;
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (j0 + lane + 32 * j < n) acc[j] += w * xr[32 * j];
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u64 col = j0 + lane + 32 * j;
        if (col < n) partial[p * n + col] = acc[j];
    }
}

__global__ void finish(const i64* __restrict__ pieces, u64 np, const float* partial, u64 n, float* y) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= np * n) return;
    u64 p = t / n, col = t % n;
    i64 row = pieces[3 * p];
    if (p > 0 && pieces[3 * (p - 1)] == row) return;
    float sum = 0;
    for (u64 q = p; q < np && pieces[3 * q] == row; ++q) sum += partial[q * n + col];
    y[(u64)row * n + col] = sum;
}

// ---- harness -----------------------------------------------------------------------------
static cudaEvent_t ev[64];

template <class F> static double median_us(F f) {
    for (int i = 0; i < 3; ++i) f();
    CK(cudaDeviceSynchronize());
    const int R = 25;
    float t[R];
    for (int i = 0; i < R; ++i) {
        CK(cudaEventRecord(ev[0]));
        f();
        CK(cudaEventRecord(ev[1]));
        CK(cudaEventSynchronize(ev[1]));
        CK(cudaEventElapsedTime(&t[i], ev[0], ev[1]));
    }
    std::sort(t, t + R);
    return t[R / 2] * 1e3;
}

static float uniform(u64 i) { return (float)((mix(0xABCD0000ull ^ i) >> 40) * (1.0 / (1 << 24)) * 2.0 - 1.0); }

int main(int argc, char** argv) {
    const u64 N = 1ull << 20, NC = 64;
    const int BLOCK = 256;
    CK(cudaEventCreate(&ev[0]));
    CK(cudaEventCreate(&ev[1]));
    cusparseHandle_t handle;
    CS(cusparseCreate(&handle));
    // Copy bandwidth, for the record.
    {
        float *a, *b;
        size_t bytes = 1ull << 30;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        CK(cudaMemset(a, 1, bytes));
        double us = median_us([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
        printf("copy 1 GiB: %.1f us, %.0f GB/s (read + write)\n", us, 2.0 * bytes / us / 1e3);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    const char* kinds[3] = {"cycle", "random16", "powerlaw"};
    for (const char* kind : kinds) {
        if (argc > 1 && !strstr(argv[1], kind)) continue;
        std::vector<u32> rp, ci;
        bench_matrix(kind, N, rp, ci);
        u64 nnz = ci.size();
        std::vector<float> vals(nnz), xv(N), xm(N * NC);
        for (u64 k = 0; k < nnz; ++k) vals[k] = uniform(k);
        for (u64 i = 0; i < N; ++i) xv[i] = uniform(1ull << 40 | i);
        for (u64 i = 0; i < N * NC; ++i) xm[i] = uniform(1ull << 41 | i);
        std::vector<i64> pieces;
        for (u64 r = 0; r < N; ++r) {
            u64 s = rp[r], e = rp[r + 1];
            if (e - s > LONG_ROW)
                for (u64 p = s; p < e; p += PIECE) { pieces.push_back(r); pieces.push_back(p); pieces.push_back(std::min(e, p + PIECE)); }
        }
        u64 np = pieces.size() / 3;
        // Host references (f64).
        std::vector<double> yref(N, 0.0), ymref(N * NC, 0.0);
        for (u64 r = 0; r < N; ++r)
            for (u64 k = rp[r]; k < rp[r + 1]; ++k) {
                yref[r] += (double)vals[k] * xv[ci[k]];
                const float* xr = &xm[(u64)ci[k] * NC];
                double* yr = &ymref[r * NC];
                for (u64 j = 0; j < NC; ++j) yr[j] += (double)vals[k] * xr[j];
            }
        u32 *d_rp, *d_ci;
        float *d_v, *d_x, *d_xm, *d_y, *d_ym, *d_part;
        i64* d_pieces;
        CK(cudaMalloc(&d_rp, rp.size() * 4));
        CK(cudaMalloc(&d_ci, nnz * 4));
        CK(cudaMalloc(&d_v, nnz * 4));
        CK(cudaMalloc(&d_x, N * 4));
        CK(cudaMalloc(&d_xm, N * NC * 4));
        CK(cudaMalloc(&d_y, N * 4));
        CK(cudaMalloc(&d_ym, N * NC * 4));
        CK(cudaMalloc(&d_part, std::max<u64>(np, 1) * NC * 4));
        CK(cudaMalloc(&d_pieces, std::max<u64>(np, 1) * 24));
        CK(cudaMemcpy(d_rp, rp.data(), rp.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_ci, ci.data(), nnz * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_v, vals.data(), nnz * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_x, xv.data(), N * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_xm, xm.data(), N * NC * 4, cudaMemcpyHostToDevice));
        if (np) CK(cudaMemcpy(d_pieces, pieces.data(), np * 24, cudaMemcpyHostToDevice));
        double mv_bytes = 4.0 * (N + 1 + nnz) + 4.0 * nnz + 8.0 * N;
        double mm_bytes = 4.0 * (N + 1 + nnz) + 4.0 * nnz + 8.0 * N * NC;
        printf("\n== %s: %llu entries, %llu long-row pieces; SpMV %.1f MB, SpMM %.1f MB counted\n", kind, nnz, np,
               mv_bytes / 1e6, mm_bytes / 1e6);
        auto check = [&](const char* what, float* d, const std::vector<double>& ref) {
            std::vector<float> got(ref.size());
            CK(cudaMemcpy(got.data(), d, ref.size() * 4, cudaMemcpyDeviceToHost));
            double worst = 0, scale = 0;
            for (size_t i = 0; i < ref.size(); ++i) scale = std::max(scale, fabs(ref[i]));
            for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, fabs(got[i] - ref[i]) / scale);
            if (worst > 1e-5) printf("  !! %s: max error %.2e of the largest\n", what, worst);
        };
        auto report = [&](const char* what, double us, double bytes) {
            printf("  %-44s %9.1f us %7.0f GB/s\n", what, us, bytes / us / 1e3);
        };
        auto grid1 = [&](u64 threads) { return dim3((u32)((threads + BLOCK - 1) / BLOCK)); };
        auto mv_long = [&] {
            if (!np) return;
            spmv_pieces<<<grid1(np * 32), BLOCK>>>(d_pieces, np, d_ci, d_v, d_x, d_part);
            finish<<<grid1(np), BLOCK>>>(d_pieces, np, d_part, 1, d_y);
        };
        for (u32 lanes : {1u, 2u, 4u, 8u, 16u, 32u}) {
            char name[64];
            snprintf(name, 64, "spmv kiln lanes %u", lanes);
            CK(cudaMemset(d_y, 0xff, N * 4));
            double us = median_us([&] { spmv_kiln<<<grid1(N * lanes), BLOCK>>>(d_rp, d_ci, d_v, d_x, d_y, N, lanes); mv_long(); });
            check(name, d_y, yref);
            report(name, us, mv_bytes);
            snprintf(name, 64, "spmv stream lanes %u", lanes);
            CK(cudaMemset(d_y, 0xff, N * 4));
            us = median_us([&] { spmv_stream<<<grid1(N * lanes), BLOCK>>>(d_rp, d_ci, d_v, d_x, d_y, N, lanes); mv_long(); });
            check(name, d_y, yref);
            report(name, us, mv_bytes);
        }
        // cuSPARSE SpMV / SpMM.
        cusparseSpMatDescr_t A;
        CS(cusparseCreateCsr(&A, N, N, nnz, d_rp, d_ci, d_v, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
        cusparseDnVecDescr_t X, Y;
        CS(cusparseCreateDnVec(&X, N, d_x, CUDA_R_32F));
        CS(cusparseCreateDnVec(&Y, N, d_y, CUDA_R_32F));
        float one = 1, zero = 0;
        for (auto alg : {CUSPARSE_SPMV_CSR_ALG1, CUSPARSE_SPMV_CSR_ALG2}) {
            size_t ws = 0;
            void* dws = nullptr;
            CS(cusparseSpMV_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, X, &zero, Y, CUDA_R_32F, alg, &ws));
            if (ws) CK(cudaMalloc(&dws, ws));
            char name[64];
            snprintf(name, 64, "spmv cusparse alg%d", alg == CUSPARSE_SPMV_CSR_ALG1 ? 1 : 2);
            double us = median_us([&] { CS(cusparseSpMV(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, X, &zero, Y, CUDA_R_32F, alg, dws)); });
            check(name, d_y, yref);
            report(name, us, mv_bytes);
            if (dws) CK(cudaFree(dws));
        }
        auto mm_long_kiln = [&] {
            if (!np) return;
            spmm_kiln_pieces<<<dim3(grid1(np * 32).x, 1), BLOCK>>>(d_pieces, np, d_ci, d_v, d_xm, NC, NC, d_part);
            finish<<<grid1(np * NC), BLOCK>>>(d_pieces, np, d_part, NC, d_ym);
        };
        for (u32 G : {8u, 16u, 32u}) {
            char name[64];
            snprintf(name, 64, "spmm kiln group %u", G);
            CK(cudaMemset(d_ym, 0xff, N * NC * 4));
            u32 tiles = (u32)((NC + 4 * G - 1) / (4 * G));
            double us = median_us([&] {
                spmm_kiln<<<dim3(grid1(N * G).x, tiles), BLOCK>>>(d_rp, d_ci, d_v, d_xm, NC, NC, d_ym, N, G);
                mm_long_kiln();
            });
            check(name, d_ym, ymref);
            report(name, us, mm_bytes);
        }
        for (int stream = 0; stream < 2; ++stream)
            for (u32 G : {2u, 4u, 8u, 16u}) {
                char name[64];
                snprintf(name, 64, "spmm panel %u cols%s", 4 * G, stream ? " stream" : "");
                CK(cudaMemset(d_ym, 0xff, N * NC * 4));
                u32 panels = (u32)(NC / (4 * G));
                double us = median_us([&] {
                    if (stream)
                        spmm_panel<true><<<dim3(grid1(N * G).x, panels), BLOCK>>>(d_rp, d_ci, d_v, d_xm, NC, d_ym, NC, N, G);
                    else
                        spmm_panel<false><<<dim3(grid1(N * G).x, panels), BLOCK>>>(d_rp, d_ci, d_v, d_xm, NC, d_ym, NC, N, G);
                    if (np) {
                        spmm_panel_pieces<<<dim3(grid1(np * 32).x, panels), BLOCK>>>(d_pieces, np, d_ci, d_v, d_xm, NC, NC, d_part, G);
                        finish<<<grid1(np * NC), BLOCK>>>(d_pieces, np, d_part, NC, d_ym);
                    }
                });
                check(name, d_ym, ymref);
                report(name, us, mm_bytes);
            }
        cusparseDnMatDescr_t XM, YM;
        CS(cusparseCreateDnMat(&XM, N, NC, NC, d_xm, CUDA_R_32F, CUSPARSE_ORDER_ROW));
        CS(cusparseCreateDnMat(&YM, N, NC, NC, d_ym, CUDA_R_32F, CUSPARSE_ORDER_ROW));
        for (auto alg : {CUSPARSE_SPMM_CSR_ALG1, CUSPARSE_SPMM_CSR_ALG2, CUSPARSE_SPMM_CSR_ALG3}) {
            size_t ws = 0;
            void* dws = nullptr;
            if (cusparseSpMM_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A,
                                        XM, &zero, YM, CUDA_R_32F, alg, &ws) != CUSPARSE_STATUS_SUCCESS)
                continue;
            if (ws) CK(cudaMalloc(&dws, ws));
            if (alg == CUSPARSE_SPMM_CSR_ALG3 &&
                cusparseSpMM_preprocess(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one,
                                        A, XM, &zero, YM, CUDA_R_32F, alg, dws) != CUSPARSE_STATUS_SUCCESS) {
                if (dws) CK(cudaFree(dws));
                continue;
            }
            char name[64];
            snprintf(name, 64, "spmm cusparse alg%d", alg == CUSPARSE_SPMM_CSR_ALG1 ? 1 : alg == CUSPARSE_SPMM_CSR_ALG2 ? 2 : 3);
            CK(cudaMemset(d_ym, 0xff, N * NC * 4));
            bool ok = true;
            double us = median_us([&] {
                if (cusparseSpMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, XM,
                                 &zero, YM, CUDA_R_32F, alg, dws) != CUSPARSE_STATUS_SUCCESS)
                    ok = false;
            });
            if (ok) {
                check(name, d_ym, ymref);
                report(name, us, mm_bytes);
            }
            if (dws) CK(cudaFree(dws));
        }
        CS(cusparseDestroySpMat(A));
        CS(cusparseDestroyDnVec(X));
        CS(cusparseDestroyDnVec(Y));
        CS(cusparseDestroyDnMat(XM));
        CS(cusparseDestroyDnMat(YM));
        for (void* p : {(void*)d_rp, (void*)d_ci, (void*)d_v, (void*)d_x, (void*)d_xm, (void*)d_y, (void*)d_ym, (void*)d_part,
                        (void*)d_pieces})
            CK(cudaFree(p));
    }
    return 0;
}
