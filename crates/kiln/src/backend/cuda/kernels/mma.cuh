// Tensor-core building blocks of the convolution kernels (conv_mma.cu, conv_wgrad_mma.cu):
// shared-memory addresses, cp.async, ldmatrix, Hopper's warpgroup MMA (sm_90a), and per
// dtype the element as staged and one m16n8 mma.sync. kiln's module for them puts this file
// after window.cuh (compile.rs); a standalone harness includes it before conv_mma.cu.

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// Hopper's warpgroup MMA (sm_90a only): four warps issue one m64nNk MMA together, A from
// registers (the same ldmatrix fragments as mma.sync, each warp its 16 rows), B read by the
// tensor cores straight from shared memory through a descriptor. B's layout there is
// K-major without swizzle: 8 rows × 16 bytes make one 128-byte core matrix; the next 8 rows
// (output channels) follow 128 bytes on (SBO), the next 16 bytes of K a whole channel tile
// further (LBO = NT·16).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WGMMA 1
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Shared memory written by the generic proxy (cp.async, stores), visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accesses of the accumulators across the asynchronous MMAs.
template <int M, int N> __device__ __forceinline__ void fence_operands(float (&acc)[M][N][4]) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) asm volatile("" : "+f"(acc[i][j][k])::"memory");
}
#define WG_D16(d)                                                                                          \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WG_D32(d)                                                                                          \
    WG_D16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),     \
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
        "+f"(d[31])
#define WG_R16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define WG_R32                                                                                        \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26," \
    "%27,%28,%29,%30,%31}"
// One warpgroup MMA of shape m64·N·k(32 bytes), accumulating into d (this warp's 16 rows,
// laid out as mma.sync's m16n8 tiles side by side), for element type T and N = 8·WN. The
// 16-bit forms take B untransposed (K-major); TF32 has no transpose operand.
template <typename T, int WN> __device__ void wg_mma(float* d, const u32* a, u64 desc);
#define WG_MMA(TY, WN, SHAPE, TYPES, DL, RL, AL, TAIL)                                                       \
    template <> __device__ __forceinline__ void wg_mma<TY, WN>(float* d, const u32* a, u64 desc) {          \
        asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPES   \
                     " " RL ", " AL ", p, 1, 1" TAIL ";}"                                                   \
                     : DL(d)                                                                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));                         \
    }
#define WG_A64 "{%32,%33,%34,%35}, %36"
#define WG_A32 "{%16,%17,%18,%19}, %20"
WG_MMA(float, 8, "m64n64k8", "tf32.tf32", WG_D32, WG_R32, WG_A64, "")
WG_MMA(float, 4, "m64n32k8", "tf32.tf32", WG_D16, WG_R16, WG_A32, "")
WG_MMA(bf16, 8, "m64n64k16", "bf16.bf16", WG_D32, WG_R32, WG_A64, ", 0")
WG_MMA(bf16, 4, "m64n32k16", "bf16.bf16", WG_D16, WG_R16, WG_A32, ", 0")
WG_MMA(f16, 8, "m64n64k16", "f16.f16", WG_D32, WG_R32, WG_A64, ", 0")
WG_MMA(f16, 4, "m64n32k16", "f16.f16", WG_D16, WG_R16, WG_A32, ", 0")
#endif

// Per dtype: the element as staged (TF32 bits, or the 16-bit bits) and one m16n8 MMA over
// 32 bytes of channels (k8 for TF32, k16 for 16-bit), accumulating in f32.
template <typename T> struct Mma;
template <> struct Mma<float> {
    typedef u32 S;
    __device__ static S stage(float v) {
        u32 r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
        return r;
    }
    __device__ static void run(float* d, const u32* a, const u32* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<bf16> {
    typedef unsigned short S;
    __device__ static S stage(bf16 v) { return v.bits; }
    __device__ static void run(float* d, const u32* a, const u32* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<f16> {
    typedef unsigned short S;
    __device__ static S stage(f16 v) { return v.bits; }
    __device__ static void run(float* d, const u32* a, const u32* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
