// Host side of the conv_direct harnesses (harness.cu, taps_mma.cu): random operands in f32 or
// bf16, and the f64 reference of the forward with bias and ReLU on a sample of outputs.
#pragma once
#include <cmath>
#include <random>
#include <vector>
#include "../harness_common.cuh"

// One square problem: b n, c → co channels, h² input, k² filter, padding pad, stride 1, with
// its random operands on the host.
template <typename T> struct Problem {
    int n, c, h, co, k, pad, oh;
    std::vector<T> x, w, b;
    Problem(int n_, int c_, int h_, int co_, int k_, int pad_)
        : n(n_), c(c_), h(h_), co(co_), k(k_), pad(pad_), oh(h_ + 2 * pad_ - k_ + 1) {
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> U(-1.f, 1.f);
        x.resize((size_t)n * c * h * h);
        w.resize((size_t)co * c * k * k);
        b.resize(co);
        for (auto& v : x) v = round_to<T>(U(rng));
        for (auto& v : w) v = round_to<T>(U(rng) * 0.2f);
        for (auto& v : b) v = round_to<T>(U(rng));
    }
    size_t outputs() const { return (size_t)n * co * oh * oh; }
    Win win() const {
        Win g{};
        g.n = n; g.c = c; g.h = h; g.w = h; g.oh = oh; g.ow = oh; g.kh = k; g.kw = k;
        g.sh = g.sw = 1; g.ph = g.pw = pad; g.dh = g.dw = 1;
        g.s[3] = 1; g.s[2] = h; g.s[1] = (u64)h * h; g.s[0] = (u64)c * h * h; g.offset = 0;
        return g;
    }
    // The largest |y − ref| / (Σ|terms| + 1e-3) over every 7th output y (packed NCHW, bias and
    // ReLU applied), and how many exceed tol.
    std::pair<double, size_t> check(const std::vector<T>& y, double tol) const {
        double worst = 0;
        size_t bad = 0;
        for (size_t i = 0; i < y.size(); i += 7) {
            size_t t = i;
            const int xo = t % oh; t /= oh;
            const int yo = t % oh; t /= oh;
            const int o = t % co;
            const int nn = (int)(t / co);
            double acc = widen(b[o]), mag = fabs(acc);
            for (int ci = 0; ci < c; ++ci)
                for (int r = 0; r < k; ++r)
                    for (int s = 0; s < k; ++s) {
                        const int iy = yo - pad + r, ix = xo - pad + s;
                        if (iy < 0 || iy >= h || ix < 0 || ix >= h) continue;
                        const double p = widen(x[(((size_t)nn * c + ci) * h + iy) * h + ix]) *
                                         widen(w[((size_t)o * c + ci) * k * k + r * k + s]);
                        acc += p;
                        mag += fabs(p);
                    }
            const double e = fabs(widen(y[i]) - std::max(acc, 0.0)) / (mag + 1e-3);
            worst = std::isnan(e) ? 1e30 : std::max(worst, e);
            if (!(e <= tol)) bad++;
        }
        return {worst, bad};
    }
};

// Device copies of a problem's operands and an output buffer.
template <typename T> struct DeviceProblem {
    T *x, *w, *b, *y;
    explicit DeviceProblem(const Problem<T>& p) {
        CK(cudaMalloc(&x, p.x.size() * sizeof(T)));
        CK(cudaMalloc(&w, p.w.size() * sizeof(T)));
        CK(cudaMalloc(&b, p.b.size() * sizeof(T)));
        CK(cudaMalloc(&y, p.outputs() * sizeof(T)));
        CK(cudaMemcpy(x, p.x.data(), p.x.size() * sizeof(T), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w, p.w.data(), p.w.size() * sizeof(T), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b, p.b.data(), p.b.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~DeviceProblem() { cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y); }
    std::vector<T> output(size_t n) const {
        std::vector<T> h(n);
        CK(cudaMemcpy(h.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};
