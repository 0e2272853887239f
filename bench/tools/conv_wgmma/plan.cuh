// The conv_wgmma harness's problem and launch plan (band rows, pitch, taps a slot, shared
// memory), as kiln's conv_mma.rs computes them; shared with bench/tools/conv_wgp.
#pragma once
#include <algorithm>

struct Prob {
    const char* name;
    int n, c, h, w, co, kh, kw, sh, sw, ph, pw, dh, dw;
};
struct PlanC {
    int warps, cin_k, pitch, tps, smem, bh, bw;
};

static inline int flat_band_rows(const Prob& p, int oh, int ow, int pixels) {
    int span = (p.kh - 1) * p.dh + 1;
    int t = (ow - 1 + pixels - 1) / ow + 1;
    int most = std::min(t, (t - 1 + oh - 1) / oh + 1);
    int best = span;
    for (int s : {1, most}) best = std::max(best, (t - s) * p.sh + s * span);
    return best;
}

static inline PlanC plan_for(const Prob& p, int elem, int warps, bool wg) {
    int oh = (p.h + 2 * p.ph - (p.kh - 1) * p.dh - 1) / p.sh + 1, ow = (p.w + 2 * p.pw - (p.kw - 1) * p.dw - 1) / p.sw + 1;
    int step = 32 / elem, cin_k = (p.c + step - 1) / step * step, units = cin_k * elem / 16;
    int pitch = (units + 1 - units % 2) * 16 / elem;
    int bw = (ow - 1) * p.sw + (p.kw - 1) * p.dw + 1;
    int bh = flat_band_rows(p, oh, ow, warps * 32);
    int channels = p.co > 32 ? 64 : 32;
    int row = wg ? cin_k : pitch;
    // kiln's mma.sync kernels: 2 weight slots, 2 blocks an SM at least; the warpgroup ones:
    // 4 slots, 12 warps an SM (their launch bound).
    int rs = bw * pitch + conv_mma_row_pad(bw, ow, p.sw, pitch * elem / 16) * (16 / elem);
    auto smem_of = [&](int t) { return (bh * rs + (wg ? WG_STAGES : 2) * t * channels * row) * elem + (wg ? 128 : 0); };
    int blocks = wg ? std::max(12 / warps, 1) : std::max(16 / warps, 2);
    int room = std::min(233472 / blocks - 1024, 232448);
    int tps = 1;
    for (int t = p.kh * p.kw; t >= 1; --t)
        if (smem_of(t) <= room) { tps = t; break; }
    // The 16-bit epilogue's [channel][pixel] tile reuses the shared memory.
    int tile = elem == 2 ? channels * (warps * 32 + 8) * elem : 0;
    return {warps, cin_k, pitch, tps, std::max(smem_of(tps), tile), bh, bw};
}
