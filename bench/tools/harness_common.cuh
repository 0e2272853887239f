// What the standalone CUDA harnesses under bench/tools share: error checking, host-side
// conversions of f32/bf16 test data, and medians of CUDA-event timings, back to back and of
// one call from an idle device (as kiln's bench times a call). Include it after kiln's
// common.cuh (for bf16).
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e = (x);                                                                         \
        if (e != cudaSuccess) {                                                                      \
            printf("CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e));   \
            exit(2);                                                                                 \
        }                                                                                            \
    } while (0)

// v rounded to T (bf16: to nearest even), and an element widened back to f32, on the host.
template <typename T> T round_to(float v);
template <> inline float round_to<float>(float v) { return v; }
template <> inline bf16 round_to<bf16>(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    bf16 b;
    b.bits = (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    return b;
}
inline float widen(float v) { return v; }
inline float widen(bf16 b) {
    const unsigned u = (unsigned)b.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Median milliseconds a call of f over `runs` runs of `reps` calls back to back.
template <typename F> float median_ms_back_to_back(F&& f, int runs = 7, int reps = 50) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < runs; ++r) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) f();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t / reps);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// Median milliseconds of one call of f from an idle device, over `runs` calls.
template <typename F> float median_ms_from_idle(F&& f, int runs = 31) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < runs; ++r) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        f();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}
