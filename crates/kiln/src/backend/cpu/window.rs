//! Sliding-window primitives on the CPU: im2col (`unfold`) and its adjoint (`fold`) for
//! convolutions, max/avg pooling and its gradient. Inputs are read through their strides
//! (any view); work is split across threads by rows of the unfolded matrix or by
//! `(image, channel)` planes, so no two threads write one element.

use super::simd::simd_fn;
use super::threads::{goes_parallel, install};
use super::CpuStorage;
use crate::backend::{BackendStorage, WindowStorage};
use crate::layout::Layout;
use crate::op::{PoolKind, Window2d};
use crate::{Error, Result, WithDType};
use rayon::prelude::*;

/// The four strides and the offset of a 4-D layout.
fn strides4(l: &Layout) -> ([usize; 4], usize) {
    let s = l.strides();
    ([s[0], s[1], s[2], s[3]], l.offset())
}

/// Input coordinate of output position `o`, kernel tap `k` along `axis`, if inside the input.
#[inline]
fn tap(win: &Window2d, axis: usize, o: usize, k: usize) -> Option<usize> {
    let size = if axis == 0 { win.h } else { win.w };
    (o * win.stride[axis] + k * win.dilation[axis])
        .checked_sub(win.padding[axis])
        .filter(|&p| p < size)
}

/// Splits `out` into chunks of `chunk` elements and runs `f(chunk index, chunk)` on each,
/// on the configured pool when the work is large.
fn for_chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if chunk == 0 {
        return;
    }
    if goes_parallel(out.len()) {
        install(|| {
            out.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c))
        });
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// The output columns `lo..hi` whose tap `k` along `axis` lands inside the input, and the
/// input coordinate of output 0 (`tap = o·stride + start`).
#[inline]
pub(super) fn valid_range(
    win: &Window2d,
    axis: usize,
    k: usize,
    out: usize,
) -> (usize, usize, isize) {
    let size = if axis == 0 { win.h } else { win.w } as isize;
    let stride = win.stride[axis] as isize;
    let start = (k * win.dilation[axis]) as isize - win.padding[axis] as isize;
    // o·stride + start ∈ [0, size)
    let lo = if start >= 0 {
        0
    } else {
        ((-start) + stride - 1) / stride
    };
    let hi = if size <= start {
        0
    } else {
        (size - start + stride - 1) / stride
    };
    let (lo, hi) = (lo as usize, (hi as usize).min(out));
    (lo.min(hi), hi, start)
}

fn unfold_typed<T: WithDType>(x: &[T], l: &Layout, win: &Window2d) -> Vec<T> {
    let cols = win.col_cols();
    let mut out = vec![T::ZERO; win.col_rows() * cols];
    for_chunks(&mut out, cols, |row, dst| unfold_row(x, l, win, row, dst));
    out
}

/// Row `row` = `(ch, i, j)` of the unfolded matrix (`n·oh·ow` values) into `dst`; every
/// element is written (zeros where the tap falls in the padding), so `dst` need not be
/// cleared first.
pub(super) fn unfold_row<T: WithDType>(
    x: &[T],
    l: &Layout,
    win: &Window2d,
    row: usize,
    dst: &mut [T],
) {
    let ([sn, sc, sh, sw], base) = strides4(l);
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let stride_w = win.stride[1];
    let (ch, i, j) = (row / (kh * kw), row / kw % kh, row % kw);
    let (y_lo, y_hi, y_start) = valid_range(win, 0, i, oh);
    let (x_lo, x_hi, x_start) = valid_range(win, 1, j, ow);
    // Input column of output column x_lo.
    let ix0 = (x_lo as isize * stride_w as isize + x_start) as usize;
    let step = stride_w * sw;
    // Unit strides over whole contiguous rows as wide as the output ("same" padding): a
    // tap's valid rows are one shifted run of the plane, copied at once; the columns
    // that fall in the padding are zeroed after.
    let one_run = win.stride == [1, 1] && sw == 1 && sh == ow && win.w == ow;
    for b in 0..win.n {
        let plane = base + b * sn + ch * sc;
        let image = &mut dst[b * oh * ow..(b + 1) * oh * ow];
        if one_run && x_lo < x_hi && y_lo < y_hi {
            image[..y_lo * ow].fill(T::ZERO);
            image[y_hi * ow..].fill(T::ZERO);
            // image[t] = x[plane + (t / ow + y_start)·ow + t % ow + x_start], except in
            // the columns outside x_lo..x_hi (which may run into the next row).
            let (skip_front, skip_back) = (x_lo, ow - x_hi);
            let (t0, t1) = (y_lo * ow + skip_front, y_hi * ow - skip_back);
            let s0 = (plane as isize
                + (y_lo as isize + y_start) * ow as isize
                + skip_front as isize
                + x_start) as usize;
            image[t0..t1].copy_from_slice(&x[s0..s0 + (t1 - t0)]);
            for d in image[y_lo * ow..y_hi * ow].chunks_exact_mut(ow) {
                d[..x_lo].fill(T::ZERO);
                d[x_hi..].fill(T::ZERO);
            }
            continue;
        }
        for (y, d) in image.chunks_exact_mut(ow).enumerate() {
            if y < y_lo || y >= y_hi || x_lo >= x_hi {
                d.fill(T::ZERO);
                continue;
            }
            let iy = (y as isize * win.stride[0] as isize + y_start) as usize;
            let src = plane + iy * sh + ix0 * sw;
            d[..x_lo].fill(T::ZERO);
            d[x_hi..].fill(T::ZERO);
            // Plain loops rather than `copy_from_slice`: rows are short (a call to memcpy
            // per 14 values cost more than the copy, measured).
            let d = &mut d[x_lo..x_hi];
            if step == 1 {
                let n = d.len();
                for (d, &s) in d.iter_mut().zip(&x[src..src + n]) {
                    *d = s;
                }
            } else {
                for (k, v) in d.iter_mut().enumerate() {
                    *v = x[src + k * step];
                }
            }
        }
    }
}

/// The type a dtype accumulates sums in: f32 for 16-bit floats and f32, f64 for f64.
pub(crate) trait Accumulate: WithDType {
    type Acc: Copy + Default + std::ops::AddAssign + Send;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(a: Self::Acc) -> Self;
}

macro_rules! accumulate_in_f32 {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Acc = f32;
            #[inline]
            fn to_acc(self) -> f32 {
                crate::FloatDType::to_f32(self)
            }
            #[inline]
            fn from_acc(a: f32) -> Self {
                crate::FloatDType::from_f32(a)
            }
        }
    )*};
}
accumulate_in_f32!(half::f16, half::bf16, f32);

impl Accumulate for f64 {
    type Acc = f64;
    #[inline]
    fn to_acc(self) -> f64 {
        self
    }
    #[inline]
    fn from_acc(a: f64) -> f64 {
        a
    }
}

/// col2im. When the matrix's rows are contiguous (an `[n·oh·ow, k]` buffer seen transposed,
/// as a GEMM's gradient arrives) each image is summed from its pixels' rows in memory order;
/// otherwise each `(image, channel)` plane from its kernel taps.
fn fold_typed<T: Accumulate>(col: &[T], l: &Layout, win: &Window2d) -> Vec<T> {
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let plane = win.h * win.w;
    let (rs, cs) = (l.strides()[0], l.strides()[1]);
    let base = l.offset();
    let mut out = vec![T::ZERO; win.n * win.c * plane];
    let taps_y: Vec<(usize, usize, isize)> = (0..kh).map(|i| valid_range(win, 0, i, oh)).collect();
    let taps_x: Vec<(usize, usize, isize)> = (0..kw).map(|j| valid_range(win, 1, j, ow)).collect();
    let (sy, sx) = (win.stride[0] as isize, win.stride[1] as isize);
    if rs == 1 && cs >= win.col_rows() {
        let image = win.c * plane;
        for_chunks(&mut out, image, |b, dst| {
            let mut acc = vec![T::Acc::default(); image];
            for y in 0..oh {
                for xo in 0..ow {
                    let pixel = base + ((b * oh + y) * ow + xo) * cs;
                    let row = &col[pixel..pixel + win.col_rows()];
                    // The taps that land inside the input for this output pixel.
                    let ys = taps_y
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| y >= t.0 && y < t.1);
                    let ys: Vec<(usize, usize)> = ys
                        .map(|(i, t)| (i, (y as isize * sy + t.2) as usize))
                        .collect();
                    let xs = taps_x
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| xo >= t.0 && xo < t.1);
                    let xs: Vec<(usize, usize)> = xs
                        .map(|(j, t)| (j, (xo as isize * sx + t.2) as usize))
                        .collect();
                    for ch in 0..win.c {
                        let taps = &row[ch * kh * kw..(ch + 1) * kh * kw];
                        let acc = &mut acc[ch * plane..(ch + 1) * plane];
                        for &(i, iy) in &ys {
                            for &(j, ix) in &xs {
                                acc[iy * win.w + ix] += taps[i * kw + j].to_acc();
                            }
                        }
                    }
                }
            }
            for (d, a) in dst.iter_mut().zip(acc) {
                *d = T::from_acc(a);
            }
        });
        return out;
    }
    for_chunks(&mut out, plane, |p, dst| fold_plane(col, l, win, p, dst));
    out
}

/// Plane `p` = `(image, channel)` of col2im from the matrix at `l`, written to `dst`.
pub(super) fn fold_plane<T: Accumulate>(
    col: &[T],
    l: &Layout,
    win: &Window2d,
    p: usize,
    dst: &mut [T],
) {
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let (rs, cs) = (l.strides()[0], l.strides()[1]);
    let (sy, sx) = (win.stride[0] as isize, win.stride[1] as isize);
    let (b, ch) = (p / win.c, p % win.c);
    let mut acc = vec![T::Acc::default(); win.h * win.w];
    for i in 0..kh {
        let (y_lo, y_hi, y_start) = valid_range(win, 0, i, oh);
        for j in 0..kw {
            let (x_lo, x_hi, x_start) = valid_range(win, 1, j, ow);
            let row = (ch * kh + i) * kw + j;
            if x_lo >= x_hi {
                continue;
            }
            let ix0 = (x_lo as isize * sx + x_start) as usize;
            for y in y_lo..y_hi {
                let iy = (y as isize * sy + y_start) as usize;
                let first = l.offset() + row * rs + ((b * oh + y) * ow + x_lo) * cs;
                let acc = &mut acc[iy * win.w + ix0..];
                if sx == 1 && cs == 1 {
                    // Contiguous on both sides: a plain loop the compiler vectorises.
                    let src = &col[first..first + (x_hi - x_lo)];
                    for (a, c) in acc.iter_mut().zip(src) {
                        *a += c.to_acc();
                    }
                } else {
                    for k in 0..x_hi - x_lo {
                        acc[k * sx as usize] += col[first + k * cs].to_acc();
                    }
                }
            }
        }
    }
    for (d, a) in dst.iter_mut().zip(acc) {
        *d = T::from_acc(a);
    }
}

/// One `(image, channel)` plane of a pooling input: `x[src]` is its first element, `sh` and
/// `sw` its row and column strides; `taps_x[j]` is [`valid_range`] of kernel column `j`.
#[derive(Clone, Copy)]
struct PoolPlane<'a, T> {
    x: &'a [T],
    src: usize,
    sh: usize,
    sw: usize,
    win: &'a Window2d,
    taps_x: &'a [(usize, usize, isize)],
}

simd_fn! {
    /// Max pool of one `(image, channel)` plane into `best` (`oh·ow`), with the input
    /// position of each maximum in `at`.
    /// The first tap, a larger value or the first NaN takes the place, so ties go to the
    /// earliest tap. Branch-free: on random data a branch on the comparison mispredicts
    /// half the time (measured: ~15 cycles per tap with one).
    fn max_pool_plane<T: WithDType>(plane: &PoolPlane<'_, T>, best: &mut [T], at: &mut [u32]) {
        let PoolPlane { x, src, sh, sw, win, taps_x } = *plane;
        let [oh, ow] = win.out_hw();
        let sx = win.stride[1];
        at.fill(u32::MAX);
        for y in 0..oh {
            let (best, at) = (&mut best[y * ow..(y + 1) * ow], &mut at[y * ow..(y + 1) * ow]);
            for i in 0..win.kernel[0] {
                let Some(iy) = tap(win, 0, y, i) else {
                    continue;
                };
                for &(x_lo, x_hi, start) in taps_x {
                    // Input column of output column x_lo.
                    let ix0 = (x_lo as isize * sx as isize + start) as usize;
                    let (first, first_id) = (src + iy * sh + ix0 * sw, (iy * win.w + ix0) as u32);
                    for k in 0..x_hi.saturating_sub(x_lo) {
                        let v = x[first + k * sx * sw];
                        let (b, a) = (&mut best[x_lo + k], &mut at[x_lo + k]);
                        #[allow(clippy::eq_op)]
                        let take = (*a == u32::MAX) | (v > *b) | ((v != v) & (*b == *b));
                        *b = std::hint::select_unpredictable(take, v, *b);
                        *a = std::hint::select_unpredictable(take, first_id + (k * sx) as u32, *a);
                    }
                }
            }
        }
    }
}

simd_fn! {
    /// [`max_pool_plane`] for the common 2×2 window with stride 2, no padding and no
    /// dilation, over rows of unit column stride: the four taps of each output are compared
    /// in registers, and the loop over output columns vectorises.
    fn max_pool_plane_2x2<T: WithDType>(
        x: &[T],
        src: usize,
        sh: usize,
        win: &Window2d,
        best: &mut [T],
        at: &mut [u32],
    ) {
        let [oh, ow] = win.out_hw();
        for y in 0..oh {
            let r0 = &x[src + 2 * y * sh..][..2 * ow];
            let r1 = &x[src + (2 * y + 1) * sh..][..2 * ow];
            let id0 = (2 * y * win.w) as u32;
            let w = win.w as u32;
            let (best, at) = (&mut best[y * ow..(y + 1) * ow], &mut at[y * ow..(y + 1) * ow]);
            for (xo, (((b, a), p0), p1)) in best
                .iter_mut()
                .zip(at.iter_mut())
                .zip(r0.chunks_exact(2))
                .zip(r1.chunks_exact(2))
                .enumerate()
            {
                let first = id0 + 2 * xo as u32;
                let (mut bv, mut av) = (p0[0], first);
                for (v, id) in [(p0[1], first + 1), (p1[0], first + w), (p1[1], first + w + 1)] {
                    // A larger value, or the first NaN, takes the place.
                    #[allow(clippy::eq_op)]
                    let take = (v > bv) | ((v != v) & (bv == bv));
                    bv = std::hint::select_unpredictable(take, v, bv);
                    av = std::hint::select_unpredictable(take, id, av);
                }
                *b = bv;
                *a = av;
            }
        }
    }
}

/// Average pool (zero padding counted) of one plane; sums in f64 one output row at a time
/// in `sum`.
fn avg_pool_plane<T: WithDType>(plane: &PoolPlane<'_, T>, dst: &mut [T], sum: &mut [f64]) {
    let PoolPlane {
        x,
        src,
        sh,
        sw,
        win,
        taps_x,
    } = *plane;
    let [oh, ow] = win.out_hw();
    let sx = win.stride[1];
    let area = (win.kernel[0] * win.kernel[1]) as f64;
    for y in 0..oh {
        sum.fill(0.0);
        for i in 0..win.kernel[0] {
            let Some(iy) = tap(win, 0, y, i) else {
                continue;
            };
            for &(x_lo, x_hi, start) in taps_x {
                let ix0 = (x_lo as isize * sx as isize + start) as usize;
                let first = src + iy * sh + ix0 * sw;
                for (k, s) in sum[x_lo..x_hi.max(x_lo)].iter_mut().enumerate() {
                    *s += x[first + k * sx * sw].to_f64();
                }
            }
        }
        for (d, &s) in dst[y * ow..(y + 1) * ow].iter_mut().zip(&*sum) {
            *d = T::from_f64(s / area);
        }
    }
}

/// Max (NaN wins, first maximum on ties) or zero-padded mean of each window, and the
/// positions of the maxima; one `(image, channel)` plane per task.
fn pool_typed<T: WithDType>(
    x: &[T],
    l: &Layout,
    win: &Window2d,
    kind: PoolKind,
) -> (Vec<T>, Vec<u32>) {
    let ([sn, sc, sh, sw], base) = strides4(l);
    let [oh, ow] = win.out_hw();
    let per_plane = oh * ow;
    let mut out = vec![T::ZERO; win.n * win.c * per_plane];
    // The columns each kernel column's tap reaches, computed once.
    let taps_x: Vec<(usize, usize, isize)> = (0..win.kernel[1])
        .map(|j| valid_range(win, 1, j, ow))
        .collect();
    let plane_start = |p: usize| base + (p / win.c) * sn + (p % win.c) * sc;
    let plane = |p: usize| PoolPlane {
        x,
        src: plane_start(p),
        sh,
        sw,
        win,
        taps_x: &taps_x,
    };
    if kind == PoolKind::Avg {
        for_chunks(&mut out, per_plane, |p, d| {
            let mut sum = vec![0f64; ow];
            avg_pool_plane(&plane(p), d, &mut sum)
        });
        return (out, Vec::new());
    }
    let mut ids = vec![0u32; out.len()];
    let two_by_two = win.kernel == [2, 2]
        && win.stride == [2, 2]
        && win.padding == [0, 0]
        && win.dilation == [1, 1]
        && sw == 1;
    let work = |(p, (d, at)): (usize, (&mut [T], &mut [u32]))| {
        if two_by_two {
            max_pool_plane_2x2(x, plane_start(p), sh, win, d, at)
        } else {
            max_pool_plane(&plane(p), d, at)
        }
    };
    if goes_parallel(out.len()) {
        install(|| {
            out.par_chunks_mut(per_plane)
                .zip(ids.par_chunks_mut(per_plane))
                .enumerate()
                .for_each(work)
        });
    } else {
        out.chunks_mut(per_plane)
            .zip(ids.chunks_mut(per_plane))
            .enumerate()
            .for_each(work);
    }
    (out, ids)
}

fn pool_backward_typed<T: WithDType>(
    g: &[T],
    l: &Layout,
    ids: Option<&[u32]>,
    win: &Window2d,
    kind: PoolKind,
) -> Vec<T> {
    let ([sn, sc, sh, sw], base) = strides4(l);
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let plane = win.h * win.w;
    let mut out = vec![T::ZERO; win.n * win.c * plane];
    let inv_area = 1.0 / (kh * kw) as f64;
    // Windows that do not overlap send each input position at most one gradient: written
    // in place, without an accumulator.
    let disjoint = (0..2).all(|a| win.stride[a] > (win.kernel[a] - 1) * win.dilation[a]);
    for_chunks(&mut out, plane, |p, dst| {
        let src = base + (p / win.c) * sn + (p % win.c) * sc;
        if let (PoolKind::Max, Some(ids), true) = (kind, ids, disjoint) {
            let ids = &ids[p * oh * ow..(p + 1) * oh * ow];
            for y in 0..oh {
                for (xo, &at) in ids[y * ow..(y + 1) * ow].iter().enumerate() {
                    if let Some(d) = dst.get_mut(at as usize) {
                        *d = g[src + y * sh + xo * sw];
                    }
                }
            }
            return;
        }
        let mut acc = vec![0f64; plane];
        for y in 0..oh {
            for xo in 0..ow {
                let gv = g[src + y * sh + xo * sw].to_f64();
                match (kind, ids) {
                    (PoolKind::Max, Some(ids)) => {
                        let at = ids[p * oh * ow + y * ow + xo] as usize;
                        if at < plane {
                            acc[at] += gv;
                        }
                    }
                    _ => {
                        for i in 0..kh {
                            let Some(iy) = tap(win, 0, y, i) else {
                                continue;
                            };
                            for j in 0..kw {
                                if let Some(ix) = tap(win, 1, xo, j) {
                                    acc[iy * win.w + ix] += gv * inv_area;
                                }
                            }
                        }
                    }
                }
            }
        }
        for (d, a) in dst.iter_mut().zip(acc) {
            *d = T::from_f64(a);
        }
    });
    out
}

/// Runs `$body` with `$v` bound to a float vector, or returns an unsupported-dtype error.
macro_rules! match_float {
    ($s:expr, $op:expr, $v:ident => $body:expr) => {
        match $s {
            CpuStorage::F16($v) => CpuStorage::F16($body),
            CpuStorage::BF16($v) => CpuStorage::BF16($body),
            CpuStorage::F32($v) => CpuStorage::F32($body),
            CpuStorage::F64($v) => CpuStorage::F64($body),
            other => {
                return Err(Error::UnsupportedDType {
                    op: $op,
                    dtype: other.dtype(),
                })
            }
        }
    };
}

/// The weight as a contiguous slice of `T` (a copy when its layout is not contiguous).
fn packed<'a, T: WithDType>(
    w: &'a CpuStorage,
    wl: &Layout,
    copy: &'a mut Option<CpuStorage>,
) -> Result<&'a [T]> {
    let range = match wl.contiguous_range() {
        Some(r) => r,
        None => {
            *copy = Some(w.copy_contiguous(wl)?);
            0..wl.elem_count()
        }
    };
    let s = copy.as_ref().unwrap_or(w);
    T::cpu_slice(s)
        .map(|v| &v[range])
        .ok_or(Error::DTypeMismatch {
            op: "conv2d",
            lhs: T::DTYPE,
            rhs: s.dtype(),
        })
}

impl WindowStorage for CpuStorage {
    fn conv2d(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        let mut copy = None;
        let c_out = wl.dims()[0];
        Ok(match self {
            CpuStorage::F32(x) => {
                let w = packed(w, wl, &mut copy)?;
                let y = super::conv_direct::forward(x, l, w, win, groups, c_out, None, false)
                    .unwrap_or_else(|| super::conv::forward(x, l, w, win, groups, c_out));
                Some(CpuStorage::F32(y))
            }
            CpuStorage::F64(x) => Some(CpuStorage::F64(super::conv::forward(
                x,
                l,
                packed(w, wl, &mut copy)?,
                win,
                groups,
                c_out,
            ))),
            _ => None,
        })
    }

    /// f32 on AVX-512 and AVX2 only (`conv_direct`): the bias and ReLU in the kernel's
    /// store. Elsewhere the caller adds the bias after [`WindowStorage::conv2d`].
    fn conv2d_bias_act(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        bias: &Self,
        bias_layout: &Layout,
        win: &Window2d,
        groups: usize,
        relu: bool,
    ) -> Result<Option<Self>> {
        let (CpuStorage::F32(x), true) = (self, super::conv_direct::enabled()) else {
            return Ok(None);
        };
        let (mut copy, mut bias_copy) = (None, None);
        let w = packed(w, wl, &mut copy)?;
        let b = packed(bias, bias_layout, &mut bias_copy)?;
        let c_out = wl.dims()[0];
        Ok(
            super::conv_direct::forward(x, l, w, win, groups, c_out, Some(b), relu)
                .map(CpuStorage::F32),
        )
    }

    fn conv2d_backward_input(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        let mut copy = None;
        let c_out = wl.dims()[0];
        Ok(match self {
            CpuStorage::F32(g) => {
                let w = packed(w, wl, &mut copy)?;
                super::conv_direct::backward_input(g, l, w, win, groups, c_out)
                    .or_else(|| super::conv::backward_input(g, l, w, win, groups, c_out))
                    .map(CpuStorage::F32)
            }
            CpuStorage::F64(g) => {
                super::conv::backward_input(g, l, packed(w, wl, &mut copy)?, win, groups, c_out)
                    .map(CpuStorage::F64)
            }
            _ => None,
        })
    }

    fn conv2d_backward_weight(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<Self>> {
        let c_out = weight_dims[0];
        Ok(match (self, g) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                super::conv_direct::backward_weight(x, l, g, gl, win, groups, c_out)
                    .or_else(|| super::conv::backward_weight(x, l, g, gl, win, groups, c_out))
                    .map(CpuStorage::F32)
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                super::conv::backward_weight(x, l, g, gl, win, groups, c_out).map(CpuStorage::F64)
            }
            _ => None,
        })
    }

    fn unfold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        Ok(match_float!(self, "conv2d (unfold)", x => unfold_typed(x, l, win)))
    }

    fn fold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        Ok(match_float!(self, "conv2d (fold)", x => fold_typed(x, l, win)))
    }

    fn pool(&self, l: &Layout, win: &Window2d, kind: PoolKind) -> Result<(Self, Option<Self>)> {
        fn typed<T: WithDType>(
            x: &[T],
            l: &Layout,
            win: &Window2d,
            kind: PoolKind,
        ) -> (CpuStorage, Option<CpuStorage>) {
            let (out, ids) = pool_typed(x, l, win, kind);
            let ids = (kind == PoolKind::Max).then_some(CpuStorage::U32(ids));
            (CpuStorage::from_vec(out), ids)
        }
        Ok(match self {
            CpuStorage::F16(x) => typed(x, l, win, kind),
            CpuStorage::BF16(x) => typed(x, l, win, kind),
            CpuStorage::F32(x) => typed(x, l, win, kind),
            CpuStorage::F64(x) => typed(x, l, win, kind),
            other => {
                return Err(Error::UnsupportedDType {
                    op: kind.name(),
                    dtype: other.dtype(),
                })
            }
        })
    }

    fn pool_backward(
        &self,
        l: &Layout,
        argmax: Option<&Self>,
        win: &Window2d,
        kind: PoolKind,
    ) -> Result<Self> {
        let ids = match (kind, argmax) {
            (PoolKind::Max, Some(CpuStorage::U32(ids))) => Some(ids.as_slice()),
            (PoolKind::Max, _) => {
                return Err(Error::Msg(
                    "max_pool2d backward: the positions of the maxima (u32) are missing".into(),
                ))
            }
            _ => None,
        };
        Ok(match_float!(self, kind.name(), g => pool_backward_typed(g, l, ids, win, kind)))
    }
}
