// Build and run on the device machine: nvcc -arch=sm_90a -O2 bench/tools/launch_idle/idle.cu -o /tmp/idle && /tmp/idle
// From-idle cost of a launch by its shape: empty kernels and a 30 µs spin, small and large
// dynamic shared memory, timed as kiln's bench times a call (events around one launch after
// a device synchronisation) and back to back.
#include <cstdio>
#include <vector>
#include <algorithm>
__global__ void empty_k() {}
__global__ void spin_k(long long ns) {
    extern __shared__ char s[];
    long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long t = t0;
    while (t - t0 < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (threadIdx.x == 0 && t == 0) s[0] = 1;
}
int main() {
    cudaFuncSetAttribute(spin_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448);
    cudaFuncSetAttribute(empty_k, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    struct Cfg { const char* name; int grid, threads, smem; long long ns; };
    Cfg cfgs[] = {{"empty 1x32", 1, 32, 0, -1}, {"empty 131x384 0 KB", 131, 384, 0, -1},
                  {"empty 131x384 229 KB", 131, 384, 229376, -1},
                  {"spin 30us 131x384 0 KB", 131, 384, 0, 30000}, {"spin 30us 131x384 229 KB", 131, 384, 229376, 30000}};
    for (auto& c : cfgs) {
        auto launch = [&]() { if (c.ns < 0) empty_k<<<c.grid, c.threads, c.smem>>>(); else spin_k<<<c.grid, c.threads, c.smem>>>(c.ns); };
        for (int i = 0; i < 5; ++i) launch();
        cudaDeviceSynchronize();
        std::vector<float> idle, b2b;
        for (int r = 0; r < 31; ++r) {
            cudaDeviceSynchronize();
            cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
            float ms; cudaEventElapsedTime(&ms, a, b); idle.push_back(ms * 1000);
        }
        for (int r = 0; r < 7; ++r) {
            cudaEventRecord(a); for (int i = 0; i < 50; ++i) launch(); cudaEventRecord(b); cudaEventSynchronize(b);
            float ms; cudaEventElapsedTime(&ms, a, b); b2b.push_back(ms * 1000 / 50);
        }
        std::sort(idle.begin(), idle.end()); std::sort(b2b.begin(), b2b.end());
        printf("%-28s from idle %.2f us (min %.2f), back to back %.2f us\n", c.name, idle[15], idle[0], b2b[3]);
    }
    printf("error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
