// Sliding-window kernels over NCHW tensors: im2col (unfold) and its adjoint (fold) for
// convolutions, max/avg pooling and its gradient. Every kernel writes each output element
// from one thread (gradients are gathered, not scattered), so results are deterministic.

// Mirrors `WindowArgs` in window.rs: the input [n, c, h, w], the output plane [oh, ow], the
// window, and the strides of the operand read through a layout (4 for an NCHW operand, the
// first 2 for the unfolded matrix).
struct Win {
    u64 n, c, h, w, oh, ow;
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
    u64 s[4];
    u64 offset;
};

#define GRID_LOOP(t, total) \
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < (total); t += (u64)blockDim.x * gridDim.x)

// col[(ch, i, j), (b, y, x)] = x[b, ch, y·sh − ph + i·dh, x·sw − pw + j·dw], 0 outside.
template <typename T> __device__ void unfold_impl(const T* x, T* col, Win g) {
    u64 np = g.n * g.oh * g.ow, total = np * g.c * (u64)(g.kh * g.kw);
    GRID_LOOP(t, total) {
        u64 r = t / np, q = t - r * np;
        i64 j = (i64)(r % (u64)g.kw);
        u64 r2 = r / (u64)g.kw;
        i64 i = (i64)(r2 % (u64)g.kh);
        u64 ch = r2 / (u64)g.kh;
        u64 xo = q % g.ow, q2 = q / g.ow;
        u64 yo = q2 % g.oh, b = q2 / g.oh;
        i64 iy = (i64)yo * g.sh - g.ph + i * g.dh;
        i64 ix = (i64)xo * g.sw - g.pw + j * g.dw;
        T v = from_c<T>(0);
        if (iy >= 0 && iy < (i64)g.h && ix >= 0 && ix < (i64)g.w)
            v = x[g.offset + b * g.s[0] + ch * g.s[1] + (u64)iy * g.s[2] + (u64)ix * g.s[3]];
        col[t] = v;
    }
}

// x[b, ch, iy, ix] = Σ over taps (i, j) landing on it of col[(ch, i, j), (b, y, x)].
template <typename T> __device__ void fold_impl(const T* col, T* x, Win g) {
    typedef typename Compute<T>::type C;
    u64 total = g.n * g.c * g.h * g.w;
    GRID_LOOP(t, total) {
        i64 ix = (i64)(t % g.w);
        u64 t2 = t / g.w;
        i64 iy = (i64)(t2 % g.h);
        u64 t3 = t2 / g.h;
        u64 ch = t3 % g.c, b = t3 / g.c;
        C acc = 0;
        for (i64 i = 0; i < g.kh; ++i) {
            i64 ny = iy + g.ph - i * g.dh;
            if (ny < 0 || ny % g.sh != 0) continue;
            i64 yo = ny / g.sh;
            if (yo >= (i64)g.oh) continue;
            for (i64 j = 0; j < g.kw; ++j) {
                i64 nx = ix + g.pw - j * g.dw;
                if (nx < 0 || nx % g.sw != 0) continue;
                i64 xo = nx / g.sw;
                if (xo >= (i64)g.ow) continue;
                u64 row = (ch * (u64)g.kh + (u64)i) * (u64)g.kw + (u64)j;
                u64 colj = (b * g.oh + (u64)yo) * g.ow + (u64)xo;
                acc += to_c(col[g.offset + row * g.s[0] + colj * g.s[1]]);
            }
        }
        x[t] = from_c<T>(acc);
    }
}

// One thread per output: the window's max (NaN wins, first on ties) and its plane position,
// or its zero-padded mean.
template <typename T> __device__ void pool_impl(const T* x, T* y, u32* ids, Win g, int is_max) {
    typedef typename Compute<T>::type C;
    u64 total = g.n * g.c * g.oh * g.ow;
    GRID_LOOP(t, total) {
        u64 xo = t % g.ow, t2 = t / g.ow;
        u64 yo = t2 % g.oh, t3 = t2 / g.oh;
        u64 ch = t3 % g.c, b = t3 / g.c;
        const T* plane = x + g.offset + b * g.s[0] + ch * g.s[1];
        C best = 0, sum = 0;
        u32 at = 0xffffffffu;
        for (i64 i = 0; i < g.kh; ++i) {
            i64 iy = (i64)yo * g.sh - g.ph + i;
            if (iy < 0 || iy >= (i64)g.h) continue;
            for (i64 j = 0; j < g.kw; ++j) {
                i64 ix = (i64)xo * g.sw - g.pw + j;
                if (ix < 0 || ix >= (i64)g.w) continue;
                C v = to_c(plane[(u64)iy * g.s[2] + (u64)ix * g.s[3]]);
                sum += v;
                if (at == 0xffffffffu || v > best || (v != v && best == best)) {
                    best = v;
                    at = (u32)((u64)iy * g.w + (u64)ix);
                }
            }
        }
        if (is_max) {
            y[t] = from_c<T>(best);
            ids[t] = at;
        } else {
            y[t] = from_c<T>(sum / (C)(g.kh * g.kw));
        }
    }
}

// dx[b, ch, iy, ix]: the gradients of the outputs whose window covers the element (for
// max-pooling, only those whose maximum it was). `g.s` are the output gradient's strides.
template <typename T>
__device__ void pool_backward_impl(const T* gy, const u32* ids, T* dx, Win g, int is_max) {
    typedef typename Compute<T>::type C;
    u64 total = g.n * g.c * g.h * g.w;
    C inv_area = (C)1 / (C)(g.kh * g.kw);
    GRID_LOOP(t, total) {
        u64 pos = t % (g.h * g.w), bc = t / (g.h * g.w);
        i64 ix = (i64)(pos % g.w), iy = (i64)(pos / g.w);
        u64 ch = bc % g.c, b = bc / g.c;
        // Outputs y with y·sh − ph ≤ iy ≤ y·sh − ph + kh − 1.
        i64 y_lo = iy + g.ph - g.kh + 1, y_hi = iy + g.ph;
        y_lo = y_lo <= 0 ? 0 : (y_lo + g.sh - 1) / g.sh;
        y_hi = y_hi < 0 ? -1 : y_hi / g.sh;
        if (y_hi >= (i64)g.oh) y_hi = (i64)g.oh - 1;
        i64 x_lo = ix + g.pw - g.kw + 1, x_hi = ix + g.pw;
        x_lo = x_lo <= 0 ? 0 : (x_lo + g.sw - 1) / g.sw;
        x_hi = x_hi < 0 ? -1 : x_hi / g.sw;
        if (x_hi >= (i64)g.ow) x_hi = (i64)g.ow - 1;
        C acc = 0;
        for (i64 yo = y_lo; yo <= y_hi; ++yo) {
            for (i64 xo = x_lo; xo <= x_hi; ++xo) {
                C v = to_c(gy[g.offset + b * g.s[0] + ch * g.s[1] + (u64)yo * g.s[2] + (u64)xo * g.s[3]]);
                if (is_max) {
                    if (ids[(bc * g.oh + (u64)yo) * g.ow + (u64)xo] == (u32)pos) acc += v;
                } else {
                    acc += v * inv_area;
                }
            }
        }
        dx[t] = from_c<T>(acc);
    }
}

#define WINDOW_FOR(T, NAME)                                                                            \
    extern "C" __global__ void unfold_##NAME(const T* x, T* col, Win g) { unfold_impl<T>(x, col, g); } \
    extern "C" __global__ void fold_##NAME(const T* col, T* x, Win g) { fold_impl<T>(col, x, g); }     \
    extern "C" __global__ void pool_##NAME(const T* x, T* y, u32* ids, Win g, int is_max) {            \
        pool_impl<T>(x, y, ids, g, is_max);                                                            \
    }                                                                                                  \
    extern "C" __global__ void pool_backward_##NAME(const T* gy, const u32* ids, T* dx, Win g,         \
                                                    int is_max) {                                      \
        pool_backward_impl<T>(gy, ids, dx, g, is_max);                                                 \
    }

WINDOW_FOR(f16, f16)
WINDOW_FOR(bf16, bf16)
WINDOW_FOR(float, f32)
WINDOW_FOR(double, f64)
