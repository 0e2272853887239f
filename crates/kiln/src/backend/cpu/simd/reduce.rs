//! Vectorised reductions over contiguous f32 runs, and the row pieces of softmax. Lanes of
//! partial results are combined at the end, so results may differ from a left-to-right fold
//! in the last bits (sums) but never in which element wins (max, argmax).

use super::math;
use super::simd_fn;
use std::mem::MaybeUninit;

/// Partial accumulators per block: enough independent chains to hide the add latency.
const LANES: usize = 32;
/// Elements summed in f32 lanes before the block's total moves to f64.
const BLOCK: usize = 4096;

/// `x` split into a head of fewer than 16 elements and a body that starts on a 64-byte
/// boundary (a cache line). Vector loads that straddle two lines cost: a 16M-element sum on
/// one thread of the 2-core EPYC ran at 41 GB/s from a 16-, 32- or 48-byte offset and at
/// 53 GB/s from a line boundary; the allocator's large blocks start 16 bytes past one.
#[inline(always)]
fn at_cache_line(x: &[f32]) -> (&[f32], &[f32]) {
    let past = x.as_ptr() as usize % 64;
    let head = if past == 0 { 0 } else { (64 - past) / 4 };
    x.split_at(head.min(x.len()))
}

simd_fn! {
    /// The sum of `x`, accumulated in f32 lanes over blocks of 4096 and in f64 across
    /// blocks (error about that of a pairwise sum).
    pub(crate) fn sum_f32(x: &[f32]) -> f64 {
        if x.len() < 2 * LANES {
            return x.iter().map(|&v| v as f64).sum();
        }
        let (head, x) = at_cache_line(x);
        let mut total: f64 = head.iter().map(|&v| v as f64).sum();
        for block in x.chunks(BLOCK) {
            let mut acc = [0f32; LANES];
            let mut chunks = block.chunks_exact(LANES);
            for c in chunks.by_ref() {
                for i in 0..LANES {
                    acc[i] += c[i];
                }
            }
            let mut s = chunks.remainder().iter().map(|&v| v as f64).sum::<f64>();
            s += acc.iter().map(|&v| v as f64).sum::<f64>();
            total += s;
        }
        total
    }
}

simd_fn! {
    /// `accs[j] += x[r * stride + j]` for every row `r < n_rows` (column sums, the shape of
    /// a bias gradient): rows are added in f32 over blocks of 64, then into the f64 totals.
    pub(crate) fn column_sums_f32(x: &[f32], n_rows: usize, stride: usize, accs: &mut [f64]) {
        let n = accs.len();
        let mut part = vec![0f32; n];
        for r0 in (0..n_rows).step_by(64) {
            part.iter_mut().for_each(|p| *p = 0.0);
            for r in r0..(r0 + 64).min(n_rows) {
                for (p, &v) in part.iter_mut().zip(&x[r * stride..r * stride + n]) {
                    *p += v;
                }
            }
            for (a, &p) in accs.iter_mut().zip(&part) {
                *a += p as f64;
            }
        }
    }
}

simd_fn! {
    /// `accs[j] +=` the sum of `x[(a·k + j)·run ..][..run]` over every slab `a < slabs`
    /// (`k = accs.len()`; the shape of a bias or batch-norm gradient, `[n, c, h, w]` summed
    /// over (0, 2, 3)): each run is added into 16 f32 lanes per output, over blocks of 16
    /// slabs, then into the f64 totals.
    pub(crate) fn plane_sums_f32(x: &[f32], slabs: usize, run: usize, accs: &mut [f64]) {
        let k = accs.len();
        let mut part = vec![[0f32; 16]; k];
        for a0 in (0..slabs).step_by(16) {
            part.iter_mut().for_each(|p| *p = [0.0; 16]);
            for a in a0..(a0 + 16).min(slabs) {
                for (j, p) in part.iter_mut().enumerate() {
                    let mut chunks = x[(a * k + j) * run..][..run].chunks_exact(16);
                    for c in chunks.by_ref() {
                        for i in 0..16 {
                            p[i] += c[i];
                        }
                    }
                    for (q, &v) in p.iter_mut().zip(chunks.remainder()) {
                        *q += v;
                    }
                }
            }
            for (acc, p) in accs.iter_mut().zip(&part) {
                *acc += p.iter().map(|&v| v as f64).sum::<f64>();
            }
        }
    }
}

/// The extremum's starting value: −∞ for a max, +∞ for a min.
#[inline(always)]
fn extremum_init<const MAX: bool>() -> f32 {
    if MAX {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    }
}

/// Max (or min) of a short run element by element, stopping at the first NaN.
#[inline(always)]
fn extremum_scan<const MAX: bool>(x: &[f32]) -> f32 {
    let mut best = extremum_init::<MAX>();
    for &v in x {
        if v.is_nan() {
            return v;
        }
        if (MAX && v > best) || (!MAX && v < best) {
            best = v;
        }
    }
    best
}

/// Max (or min, `MAX = false`) of a non-empty run, NaN if any element is NaN.
#[inline(always)]
fn extremum<const MAX: bool>(x: &[f32]) -> f32 {
    if x.len() < 2 * LANES {
        return extremum_scan::<MAX>(x);
    }
    let init = extremum_init::<MAX>();
    let (head, x) = at_cache_line(x);
    let mut m = [init; LANES];
    // `v > m` is false for a NaN `v`, so the lanes skip NaNs; a plain sum of the same
    // elements says whether there was one (NaN + anything is NaN). The sum runs on the adder
    // while the max runs on the comparer: tracking NaNs by a compare and a select per vector
    // instead halved the rate on a Zen 2/3 (AVX2, 64K elements: 26.8 → 52 GB/s).
    let mut sum = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in chunks.by_ref() {
        for i in 0..LANES {
            let v = c[i];
            let better = if MAX { v > m[i] } else { v < m[i] };
            m[i] = if better { v } else { m[i] };
            sum[i] += v;
        }
    }
    // A NaN sum means a NaN element, or +∞ and −∞ met in one lane (inputs with both
    // infinities, or a lane's sum overflowing one way before an infinity of the other sign):
    // a second pass then looks for NaNs alone (a fold without an early exit, so it
    // vectorises).
    if sum.iter().any(|s| s.is_nan()) && x.iter().fold(false, |a, &v| a | v.is_nan()) {
        return f32::NAN;
    }
    let mut best = init;
    for &v in m.iter().chain(chunks.remainder()).chain(head) {
        if v.is_nan() {
            return v;
        }
        if (MAX && v > best) || (!MAX && v < best) {
            best = v;
        }
    }
    best
}

simd_fn! {
    /// The maximum of a non-empty run; NaN if any element is NaN.
    pub(crate) fn max_f32(x: &[f32]) -> f32 {
        extremum::<true>(x)
    }
}

simd_fn! {
    /// The minimum of a non-empty run; NaN if any element is NaN.
    pub(crate) fn min_f32(x: &[f32]) -> f32 {
        extremum::<false>(x)
    }
}

simd_fn! {
    /// Index of the first maximum (`MAX`) or minimum of a non-empty run, or of its first NaN
    /// (as PyTorch does): the extremum first, then the first position holding it.
    pub(crate) fn arg_extremum_f32(x: &[f32], max: bool) -> usize {
        let m = if max { extremum::<true>(x) } else { extremum::<false>(x) };
        // The first position holding `m` (NaN matches NaN): whole blocks are tested without
        // an early exit, so the test vectorises; the hit is then found inside its block.
        let nan = m.is_nan();
        let hit = |v: f32| if nan { v.is_nan() } else { v == m };
        let mut base = 0;
        for block in x.chunks(LANES) {
            if block.iter().fold(false, |a, &v| a | hit(v)) {
                return base + block.iter().position(|&v| hit(v)).unwrap_or(0);
            }
            base += block.len();
        }
        0
    }
}

/// `out[i] = e^(x[i] - shift)`, returning the sum of the outputs (softmax's middle pass; rows of
/// at least 64, shorter ones go through `short_softmax_rows`).
#[inline(always)]
fn exp_shifted_sum_body<const FMA: bool>(
    x: &[f32],
    shift: f32,
    out: &mut [MaybeUninit<f32>],
) -> f32 {
    let mut acc = [0f32; LANES];
    let mut xs = x.chunks_exact(LANES);
    let mut os = out.chunks_exact_mut(LANES);
    for (c, o) in xs.by_ref().zip(os.by_ref()) {
        for i in 0..LANES {
            let e = math::exp_nonpositive::<FMA>(c[i] - shift);
            o[i].write(e);
            acc[i] += e;
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (&v, o) in xs.remainder().iter().zip(os.into_remainder()) {
        let e = math::exp_nonpositive::<FMA>(v - shift);
        o.write(e);
        s += e;
    }
    s
}

/// The sum of `e^(x[i] - shift)` (log-softmax's middle pass).
#[inline(always)]
fn sum_exp_shifted_body<const FMA: bool>(x: &[f32], shift: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut xs = x.chunks_exact(LANES);
    for c in xs.by_ref() {
        for i in 0..LANES {
            acc[i] += math::exp_nonpositive::<FMA>(c[i] - shift);
        }
    }
    let tail: f32 = xs
        .remainder()
        .iter()
        .map(|&v| math::exp_nonpositive::<FMA>(v - shift))
        .sum();
    acc.iter().sum::<f32>() + tail
}

simd_fn! {
    /// Softmax (or log-softmax, `log`) of each row of length `n` that makes up `x`, into
    /// `out`: the max subtracted first. A row whose max is NaN or infinite is NaN throughout,
    /// as in PyTorch (`x - max` is NaN somewhere in it: NaN, inf - inf, or -inf - -inf).
    pub(crate) fn softmax_rows_f32(x: &[f32], n: usize, out: &mut [MaybeUninit<f32>], log: bool) {
        #[cfg(target_arch = "x86_64")]
        if n >= 2 * LANES && super::simd_level() == super::SimdLevel::Avx512 {
            // SAFETY: the level is AVX-512, so the CPU has every feature the kernel is
            // compiled for.
            return unsafe { super::avx512::softmax::softmax_rows(x, n, out, log) };
        }
        if n < 2 * LANES {
            return short_softmax_rows::<FMA>(x, n, out, log);
        }
        for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let m = extremum::<true>(row);
            if !m.is_finite() {
                nan_row(o);
                continue;
            }
            if log {
                let ls = sum_exp_shifted_body::<FMA>(row, m).ln();
                for (o, &v) in o.iter_mut().zip(row) {
                    o.write((v - m) - ls);
                }
            } else {
                let inv = 1.0 / exp_shifted_sum_body::<FMA>(row, m, o);
                for o in o.iter_mut() {
                    // SAFETY: `exp_shifted_sum_body` has just written every element.
                    let v = unsafe { o.assume_init() };
                    o.write(v * inv);
                }
            }
        }
    }
}

simd_fn! {
    /// `ln Σ e^x` of each row of length `n > 0` that makes up `x`, into `out` (one value per
    /// row), the row's max subtracted first. A row holding +inf gives +inf, one of -inf gives
    /// -inf, and NaN anywhere gives NaN. The error is a few ulp of the result plus the f32
    /// sum's rounding (about n/16 units of 2⁻²⁴, absolute); measured worst 0.54 ulp on random
    /// rows of 1 to 4096 elements (`ops_reduce`'s `logsumexp_of_long_rows_and_special_values`).
    pub(crate) fn logsumexp_rows_f32(x: &[f32], n: usize, out: &mut [f32]) {
        if n < 2 * LANES {
            return short_logsumexp_rows::<FMA>(x, n, out);
        }
        for (row, o) in x.chunks_exact(n).zip(out.iter_mut()) {
            let m = extremum::<true>(row);
            *o = if m.is_finite() {
                math::ln::<FMA>(sum_exp_shifted_body::<FMA>(row, m)) + m
            } else {
                // NaN: NaN. +inf: no NaN in the row (the max would be NaN), so the sum is
                // +inf; -inf: every element is -inf and the sum is 0.
                m
            };
        }
    }
}

/// Rows too short for a vector loop of their own (`n < 64`), as `short_softmax_rows`: the
/// exponentials of a group of rows (~256 elements) go through one vector loop.
#[inline(always)]
fn short_logsumexp_rows<const FMA: bool>(x: &[f32], n: usize, out: &mut [f32]) {
    const GROUP: usize = 256;
    let rows_per_group = (GROUP / n).max(1);
    let mut shifted = [0f32; GROUP];
    for (xg, og) in x
        .chunks(rows_per_group * n)
        .zip(out.chunks_mut(rows_per_group))
    {
        let buf = &mut shifted[..xg.len()];
        for ((row, b), o) in xg
            .chunks_exact(n)
            .zip(buf.chunks_exact_mut(n))
            .zip(og.iter_mut())
        {
            // The max waits in `out`; a row whose max is not finite takes it as its result.
            *o = shifted_by_max(row, b);
        }
        for b in buf.iter_mut() {
            *b = math::exp_nonpositive::<FMA>(*b);
        }
        let mut sums = [1f32; GROUP];
        for (e, s) in buf.chunks_exact(n).zip(sums.iter_mut()) {
            *s = e.iter().sum();
        }
        // One vector loop of logarithms; a non-finite row keeps its max.
        for (o, &s) in og.iter_mut().zip(sums.iter()) {
            let l = math::ln::<FMA>(s);
            *o = if o.is_finite() { *o + l } else { *o };
        }
    }
}

/// Softmax's output for a row whose max is NaN or infinite (or that holds a NaN).
#[inline(always)]
pub(super) fn nan_row(out: &mut [MaybeUninit<f32>]) {
    for o in out {
        o.write(f32::NAN);
    }
}

/// `b = row - max(row)`, returning the max; zeros where the max is not finite (NaN or
/// infinite: the caller gives such a row its own result, and exponentiates the zeros
/// meanwhile).
#[inline(always)]
fn shifted_by_max(row: &[f32], b: &mut [f32]) -> f32 {
    let m = extremum::<true>(row);
    if m.is_finite() {
        for (b, &v) in b.iter_mut().zip(row) {
            *b = v - m;
        }
    } else {
        b.fill(0.0);
    }
    m
}

/// Rows too short for a vector loop of their own (`n < 64`): the exponentials of a group of
/// rows (~256 elements) go through one vector loop over a stack buffer.
#[inline(always)]
fn short_softmax_rows<const FMA: bool>(
    x: &[f32],
    n: usize,
    out: &mut [MaybeUninit<f32>],
    log: bool,
) {
    const GROUP: usize = 256;
    let rows_per_group = (GROUP / n).max(1);
    let mut shifted = [0f32; GROUP];
    let mut maxes = [0f32; GROUP];
    for (xg, og) in x
        .chunks(rows_per_group * n)
        .zip(out.chunks_mut(rows_per_group * n))
    {
        let buf = &mut shifted[..xg.len()];
        for ((row, b), m) in xg
            .chunks_exact(n)
            .zip(buf.chunks_exact_mut(n))
            .zip(maxes.iter_mut())
        {
            // A row whose max is not finite is written as NaN below.
            *m = shifted_by_max(row, b);
        }
        let mut exps = [0f32; GROUP];
        let exps = &mut exps[..xg.len()];
        for (e, &b) in exps.iter_mut().zip(buf.iter()) {
            *e = math::exp_nonpositive::<FMA>(b);
        }
        for (((b, e), o), m) in buf
            .chunks_exact(n)
            .zip(exps.chunks_exact(n))
            .zip(og.chunks_exact_mut(n))
            .zip(&maxes)
        {
            if !m.is_finite() {
                nan_row(o);
                continue;
            }
            let s: f32 = e.iter().sum();
            if log {
                let ls = s.ln();
                for (o, &v) in o.iter_mut().zip(b) {
                    o.write(v - ls);
                }
            } else {
                let inv = 1.0 / s;
                for (o, &v) in o.iter_mut().zip(e) {
                    o.write(v * inv);
                }
            }
        }
    }
}
