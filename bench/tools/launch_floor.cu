// The floor under kiln's eager per-op host cost on this machine: what the driver alone takes
// to launch a 1024-element f32 add back to back, with nothing of kiln's around it.
//   nvcc -O2 -o /tmp/launch_floor bench/tools/launch_floor.cu -lcuda && /tmp/launch_floor
// Rows (µs per op, median of 7 runs of 20 000 ops, one synchronisation at the end of each;
// in brackets the host's time alone, bursts of 200 that never fill the launch queue):
//   driver_launch          cuLaunchKernel of the add on a non-blocking stream
//   driver_launch_alloc    the same plus cuMemAllocAsync/cuMemFreeAsync of the output
//   runtime_launch         the <<<>>> launch through the runtime
// and the GPU-side floor: the same adds recorded in a CUDA graph and replayed.
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

#define CK(x)                                                                  \
  do {                                                                         \
    auto e = (x);                                                              \
    if (e != 0) { std::printf("%s failed: %d\n", #x, (int)e); std::exit(1); }  \
  } while (0)

// Host time alone: bursts of 200 (the launch queue never fills), median of 50.
template <class F>
static double host_us(F f, cudaStream_t s) {
  std::vector<double> runs;
  for (int r = 0; r < 50; r++) {
    CK(cudaStreamSynchronize(s));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; i++) f();
    auto t1 = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
  }
  CK(cudaStreamSynchronize(s));
  std::sort(runs.begin(), runs.end());
  return runs[25];
}

template <class F>
static double per_op_us(F f, int reps, cudaStream_t s) {
  std::vector<double> runs;
  for (int r = 0; r < 7; r++) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; i++) f();
    CK(cudaStreamSynchronize(s));
    auto t1 = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / reps);
  }
  std::sort(runs.begin(), runs.end());
  return runs[3];
}

int main() {
  const unsigned n = 1024;
  const int reps = 20000;
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *a, *b, *out;
  CK(cudaMalloc(&a, n * 4));
  CK(cudaMalloc(&b, n * 4));
  CK(cudaMalloc(&out, n * 4));
  CUfunction fn;
  CK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&fn), (const void*)add_f32));
  unsigned nn = n;
  void* args[] = {&out, &a, &b, &nn};
  auto launch = [&] {
    CK(cuLaunchKernel(fn, 1, 1, 1, 1024, 1, 1, 0, (CUstream)s, args, nullptr));
  };
  for (int i = 0; i < 1000; i++) launch();
  CK(cudaStreamSynchronize(s));
  std::printf("driver_launch %.3f us (host alone %.3f us)\n", per_op_us(launch, reps, s), host_us(launch, s));

  auto launch_alloc = [&] {
    CUdeviceptr o;
    CK(cuMemAllocAsync(&o, n * 4, (CUstream)s));
    void* a2[] = {&o, &a, &b, &nn};
    CK(cuLaunchKernel(fn, 1, 1, 1, 1024, 1, 1, 0, (CUstream)s, a2, nullptr));
    CK(cuMemFreeAsync(o, (CUstream)s));
  };
  std::printf("driver_launch_alloc %.3f us (host alone %.3f us)\n", per_op_us(launch_alloc, reps, s), host_us(launch_alloc, s));

  auto runtime = [&] { add_f32<<<1, 1024, 0, s>>>(out, a, b, n); };
  std::printf("runtime_launch %.3f us (host alone %.3f us)\n", per_op_us(runtime, reps, s), host_us(runtime, s));

  // GPU-side floor: 1000 adds in one graph, replayed.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 1000; i++) add_f32<<<1, 1024, 0, s>>>(out, a, b, n);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  auto replay = [&] { CK(cudaGraphLaunch(ge, s)); };
  std::printf("graph_node %.3f us\n", per_op_us(replay, 20, s) / 1000.0);
  return 0;
}
