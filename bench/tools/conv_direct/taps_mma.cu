// Experiment (session 48): the first layer's forward on tensor cores, for comparison with kiln's
// direct kernel (conv_direct_wide in kernels/window.cu). A convolution of few taps per output
// channel (c·kh·kw ≤ 32, stride 1) is a GEMM of M = pixels, K = the taps (padded to 32), N = 32
// output channels: a block stages a band of input rows (zero-padded, TF32-rounded or 16-bit)
// in shared memory, each warp builds its A fragments for 16 pixels straight from the band
// (8 tap offsets a thread, worked out once), the filter's B fragments stay in registers for
// the whole kernel, and the epilogue adds the bias, applies ReLU and stores NCHW.
//   nvcc -arch=sm_90a -O3 -std=c++17 -I crates/kiln/src/backend/cuda/kernels \
//        bench/tools/conv_direct/taps_mma.cu -o /tmp/tm && /tmp/tm
#include "common.cuh"
#include "window.cuh"
#include "window.cu"
#include "mma.cuh"
#include "conv_mma.cu"
#include "check.cuh"

#define TM_ROWS 7      // output rows a block at most
#define TM_MAXPX 224   // output pixels a block at most (the shared output tile)
#define TM_BAND 4096   // staged input elements a block at most

// y[b][co][oh][ow] for co in the block's tile of 32 (blockIdx.y), rows [band·TM_ROWS, +TM_ROWS)
// of image b (blockIdx.x = b · bands + band). x packed NCHW, w packed [c_out][c·kh·kw].
template <typename T>
__global__ void __launch_bounds__(256) taps_mma(const T* x, const T* w, T* y, Win g, int c_out, const T* bias, int relu,
                                               int rows, int smem_out) {
    typedef typename Mma<T>::S S;
    constexpr bool WIDE = sizeof(S) == 2;  // 16-bit: k16 steps
    const int H = (int)g.h, W = (int)g.w, C = (int)g.c, KH = (int)g.kh, KW = (int)g.kw, OH = (int)g.oh, OW = (int)g.ow;
    const int PW = (int)g.pw, PH = (int)g.ph, K = C * KH * KW;
    const int bands = (OH + rows - 1) / rows, b = blockIdx.x / bands, oh0 = (blockIdx.x % bands) * rows;
    const int rows_out = min(rows, OH - oh0), rows_in = rows_out + KH - 1, pw = OW + KW - 1;
    const int plane_s = rows_in * pw;
    __shared__ S band[TM_BAND + 1];  // the last word: a zero for padded taps
    __shared__ T out_tile[32 * (TM_MAXPX + 1)];
    const int zero = C * plane_s;
    for (int i = threadIdx.x; i < zero + 1; i += blockDim.x) {
        S v = 0;
        if (i < zero) {
            const int ci = i / plane_s, r = (i - ci * plane_s) / pw, col = i - ci * plane_s - r * pw;
            const int iy = oh0 - PH + r, ix = col - PW;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                v = Mma<T>::stage(x[(((u64)b * C + ci) * H + iy) * W + ix]);
        }
        band[i] = v;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    // The 8 taps this thread's A fragments read, as band offsets (a padded tap: the zero word).
    int off[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int k = WIDE ? (j >> 2) * 16 + 2 * tq + (j & 1) + ((j >> 1) & 1) * 8 : (j >> 1) * 8 + tq + (j & 1) * 4;
        if (k < K) {
            const int ci = k / (KH * KW), r = (k / KW) % KH, s = k % KW;
            off[j] = ci * plane_s + r * pw + s;
        } else {
            off[j] = -1;
        }
    }
    // B fragments of the block's 32 channels: 4 n8 tiles × (TF32: 4 k8 steps; 16-bit: 2 k16).
    const int co0 = blockIdx.y * 32;
    u32 bf[4][4][2];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj)
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = co0 + nj * 8 + gq;
                if (WIDE) {
                    if (s >= 2) { bf[nj][s][h] = 0; continue; }
                    const int k = s * 16 + 2 * tq + h * 8;
                    u32 lo = 0, hi = 0;
                    if (n < c_out && k < K) lo = Mma<T>::stage(w[(u64)n * K + k]);
                    if (n < c_out && k + 1 < K) hi = Mma<T>::stage(w[(u64)n * K + k + 1]);
                    bf[nj][s][h] = lo | (hi << 16);
                } else {
                    const int k = s * 8 + tq + h * 4;
                    bf[nj][s][h] = n < c_out && k < K ? (u32)Mma<T>::stage(w[(u64)n * K + k]) : 0u;
                }
            }
    float bias_v[4][2];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int n = co0 + nj * 8 + 2 * tq + h;
            bias_v[nj][h] = bias && n < c_out ? to_c(bias[n]) : 0.f;
        }
    __syncthreads();
    const int npx = rows_out * OW, tiles = (npx + 15) / 16;
    const u64 plane = (u64)OH * OW;
    for (int tile = warp; tile < tiles; tile += blockDim.x >> 5) {
        int base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int p = tile * 16 + gq + 8 * h;
            if (p >= npx) p = npx - 1;
            const int r = p / OW;
            base[h] = r * pw + (p - r * OW);
        }
        float acc[4][4];
#pragma unroll
        for (int nj = 0; nj < 4; ++nj)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[nj][q] = 0.f;
        auto at = [&](int h, int j) -> u32 { return off[j] < 0 ? 0u : (u32)band[base[h] + off[j]]; };
        constexpr int STEPS = WIDE ? 2 : 4;
#pragma unroll
        for (int s = 0; s < STEPS; ++s) {
            u32 a[4];
            if (WIDE) {
                a[0] = at(0, 4 * s) | (at(0, 4 * s + 1) << 16);
                a[1] = at(1, 4 * s) | (at(1, 4 * s + 1) << 16);
                a[2] = at(0, 4 * s + 2) | (at(0, 4 * s + 3) << 16);
                a[3] = at(1, 4 * s + 2) | (at(1, 4 * s + 3) << 16);
            } else {
                a[0] = at(0, 2 * s);
                a[1] = at(1, 2 * s);
                a[2] = at(0, 2 * s + 1);
                a[3] = at(1, 2 * s + 1);
            }
#pragma unroll
            for (int nj = 0; nj < 4; ++nj) Mma<T>::run(acc[nj], a, bf[nj][s]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int p = tile * 16 + gq + 8 * h;
            if (p >= npx) continue;
#pragma unroll
            for (int nj = 0; nj < 4; ++nj)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = co0 + nj * 8 + 2 * tq + e;
                    if (n >= c_out) continue;
                    float v = acc[nj][2 * h + e] + bias_v[nj][e];
                    if (relu) v = v <= 0.f ? 0.f : v;
                    if (smem_out)
                        out_tile[(nj * 8 + 2 * tq + e) * (TM_MAXPX + 1) + p] = from_c<T>(v);
                    else
                        y[((u64)b * c_out + n) * plane + (u64)oh0 * OW + p] = from_c<T>(v);
                }
        }
    }
    if (!smem_out) return;
    // The band's pixels of a channel are one contiguous run of y: a warp a channel at a time.
    __syncthreads();
    for (int ch = warp; ch < 32 && co0 + ch < c_out; ch += blockDim.x >> 5) {
        T* yp = y + ((u64)b * c_out + co0 + ch) * plane + (u64)oh0 * OW;
        for (int p = lane; p < npx; p += 32) yp[p] = out_tile[ch * (TM_MAXPX + 1) + p];
    }
}

template <typename T>
static int run(const char* name, int n, int c, int h, int co, int k, int pad, const char* tname) {
    const Problem<T> p(n, c, h, co, k, pad);
    DeviceProblem<T> d(p);
    const Win g = p.win();
    const int oh = p.oh, ow = p.oh;
    // Rows a block: at most TM_ROWS and TM_MAXPX pixels, fewer where that leaves under 4 blocks an SM.
    int rows = std::min(TM_ROWS, TM_MAXPX / ow);
    while (rows > 1 && c * (rows + k - 1) * (ow + k - 1) > TM_BAND) --rows;
    while (rows > 1 && (size_t)n * ((oh + rows - 1) / rows) * ((co + 31) / 32) < 4 * 132) --rows;
    const int bands = (oh + rows - 1) / rows;
    dim3 grid(n * bands, (co + 31) / 32);
    int smem_out = 1;
    auto launch = [&]() { taps_mma<T><<<grid, 256>>>(d.x, d.w, d.y, g, co, d.b, 1, rows, smem_out); };
    // kiln's direct kernel on the same problem (into its own output).
    T* y2;
    CK(cudaMalloc(&y2, p.outputs() * sizeof(T)));
    dim3 gd((unsigned)std::min<size_t>(((size_t)n * oh * ow + 255) / 256, 132 * 16), (co + 31) / 32);
    auto direct = [&]() {
        if constexpr (sizeof(T) == 4) conv_direct_wide_f32<<<gd, 256>>>(d.x, d.w, y2, g, (u64)co, d.b, 1);
        else conv_direct_wide_bf16<<<gd, 256>>>(d.x, d.w, y2, g, (u64)co, d.b, 1);
    };
    launch();
    direct();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const auto [worst, bad] = p.check(d.output(p.outputs()), sizeof(T) == 4 ? 2e-3 : 1e-2);
    smem_out = 0;
    const float tf = median_ms_back_to_back(launch), tf_idle = median_ms_from_idle(launch);
    smem_out = 1;
    const float tm = median_ms_back_to_back(launch), tm_idle = median_ms_from_idle(launch);
    const float td = median_ms_back_to_back(direct), td_idle = median_ms_from_idle(direct);
    printf("%-18s %-4s %d rows × %u blocks: taps_mma %.4f ms back to back, %.4f from idle (stores from fragments %.4f, %.4f) | direct %.4f, %.4f | worst %.2e of Σ|x·w|, %zu bad\n",
           name, tname, rows, grid.x * grid.y, tm, tm_idle, tf, tf_idle, td, td_idle, worst, bad);
    cudaFree(y2);
    return bad != 0;
}

int main() {
    int fails = 0;
    for (int r = 0; r < 2; ++r) {
        fails += run<float>("b256 1->32 28 k5", 256, 1, 28, 32, 5, 2, "tf32");
        fails += run<bf16>("b256 1->32 28 k5", 256, 1, 28, 32, 5, 2, "bf16");
        fails += run<float>("b1 3->64 224 k3", 1, 3, 224, 64, 3, 1, "tf32");
        fails += run<bf16>("b1 3->64 224 k3", 1, 3, 224, 64, 3, 1, "bf16");
    }
    printf("taps_mma: %d failing runs\n", fails);
    return fails != 0;
}
