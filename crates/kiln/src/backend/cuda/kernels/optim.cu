// Fused, in-place optimizer steps over contiguous parameter p, gradient g and state buffers,
// one element per thread in a grid-stride loop, several parameters per launch; the formulas
// of torch.optim (see UpdateRule). A non-null `sched` ([lr, step] in device memory) overrides
// the learning rate and Adam's step count, so a recorded step follows a schedule.

template <typename T>
__device__ void sgd_impl(u64 n, T* p, const T* g, T* v, double lr, double mu, double wd, int nesterov) {
    typedef typename Compute<T>::type C;
    const C lr_c = (C)lr, mu_c = (C)mu, wd_c = (C)wd;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {
        C pc = to_c(p[i]);
        C gc = to_c(g[i]) + wd_c * pc;
        if (v) {
            C vc = mu_c * to_c(v[i]) + gc;
            v[i] = from_c<T>(vc);
            gc = nesterov ? gc + mu_c * vc : vc;
        }
        p[i] = from_c<T>(pc - lr_c * gc);
    }
}

template <typename T>
__device__ void adam_impl(u64 n, T* p, const T* g, T* m, T* v, double lr, double b1, double b2, double eps,
                          double wd, int decoupled, double step_size, double inv_bc2) {
    typedef typename Compute<T>::type C;
    const C lr_c = (C)lr, b1_c = (C)b1, b2_c = (C)b2, e = (C)eps, wd_c = (C)wd;
    const C ss = (C)step_size, ib = (C)inv_bc2;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {
        C pc = to_c(p[i]);
        C gc = to_c(g[i]);
        if (decoupled) pc = pc * ((C)1 - lr_c * wd_c);
        else gc = gc + wd_c * pc;
        C mc = b1_c * to_c(m[i]) + ((C)1 - b1_c) * gc;
        C vc = b2_c * to_c(v[i]) + ((C)1 - b2_c) * gc * gc;
        m[i] = from_c<T>(mc);
        v[i] = from_c<T>(vc);
        p[i] = from_c<T>(pc - ss * mc / (k_sqrt(vc * ib) + e));
    }
}

// Up to GROUP tensors per launch: grid (x, count), blockIdx.y picks the tensor. Mirrors
// `UpdateGroup` in cuda/fused.rs.
#define GROUP 8
struct UpdateGroup {
    u64 n[GROUP];
    u64 p[GROUP];
    u64 g[GROUP];
    u64 s0[GROUP];
    u64 s1[GROUP];
};

#define OPTIM_FOR(T, NAME)                                                                                 \
    extern "C" __global__ void sgd_##NAME(UpdateGroup t, double lr, double mu, double wd, int nesterov,   \
                                          const double* sched) {                                          \
        const int i = blockIdx.y;                                                                         \
        if (sched) lr = sched[0];                                                                         \
        sgd_impl<T>(t.n[i], (T*)t.p[i], (const T*)t.g[i], (T*)t.s0[i], lr, mu, wd, nesterov);            \
    }                                                                                                     \
    extern "C" __global__ void adam_##NAME(UpdateGroup t, double lr, double b1, double b2, double eps,   \
                                           double wd, int decoupled, double step_size, double inv_bc2,    \
                                           const double* sched) {                                         \
        const int i = blockIdx.y;                                                                         \
        if (sched) {                                                                                      \
            lr = sched[0];                                                                                \
            step_size = lr / (1.0 - pow(b1, sched[1]));                                                   \
            inv_bc2 = 1.0 / (1.0 - pow(b2, sched[1]));                                                    \
        }                                                                                                 \
        adam_impl<T>(t.n[i], (T*)t.p[i], (const T*)t.g[i], (T*)t.s0[i], (T*)t.s1[i], lr, b1, b2, eps, wd, \
                     decoupled, step_size, inv_bc2);                                                      \
    }
OPTIM_FOR(f16, f16)
OPTIM_FOR(bf16, bf16)
OPTIM_FOR(float, f32)
OPTIM_FOR(double, f64)
