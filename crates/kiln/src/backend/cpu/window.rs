//! Sliding-window primitives on the CPU: im2col (`unfold`) and its adjoint (`fold`) for
//! convolutions, max/avg pooling and its gradient. Inputs are read through their strides
//! (any view); work is split across threads by rows of the unfolded matrix or by
//! `(image, channel)` planes, so no two threads write one element.

use super::threads::{install, PARALLEL_THRESHOLD};
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
    if out.len() >= PARALLEL_THRESHOLD {
        install(|| {
            out.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c))
        });
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

fn unfold_typed<T: WithDType>(x: &[T], l: &Layout, win: &Window2d) -> Vec<T> {
    let ([sn, sc, sh, sw], base) = strides4(l);
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let cols = win.col_cols();
    let mut out = vec![T::ZERO; win.col_rows() * cols];
    for_chunks(&mut out, cols, |row, dst| {
        let (ch, i, j) = (row / (kh * kw), row / kw % kh, row % kw);
        for b in 0..win.n {
            let plane = base + b * sn + ch * sc;
            for y in 0..oh {
                let d = &mut dst[(b * oh + y) * ow..(b * oh + y + 1) * ow];
                let Some(iy) = tap(win, 0, y, i) else {
                    continue; // the row stays zero
                };
                let src = plane + iy * sh;
                for (xo, v) in d.iter_mut().enumerate() {
                    if let Some(ix) = tap(win, 1, xo, j) {
                        *v = x[src + ix * sw];
                    }
                }
            }
        }
    });
    out
}

/// Element `(r, c)` of a 2-D layout.
#[inline]
fn at2(l: &Layout, r: usize, c: usize) -> usize {
    l.offset() + r * l.strides()[0] + c * l.strides()[1]
}

fn fold_typed<T: WithDType>(col: &[T], l: &Layout, win: &Window2d) -> Vec<T> {
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let plane = win.h * win.w;
    let mut out = vec![T::ZERO; win.n * win.c * plane];
    for_chunks(&mut out, plane, |p, dst| {
        let (b, ch) = (p / win.c, p % win.c);
        let mut acc = vec![0f64; plane];
        for i in 0..kh {
            for j in 0..kw {
                let row = (ch * kh + i) * kw + j;
                for y in 0..oh {
                    let Some(iy) = tap(win, 0, y, i) else {
                        continue;
                    };
                    for xo in 0..ow {
                        if let Some(ix) = tap(win, 1, xo, j) {
                            let c = (b * oh + y) * ow + xo;
                            acc[iy * win.w + ix] += col[at2(l, row, c)].to_f64();
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

/// Max (NaN wins, first maximum on ties) or zero-padded mean of each window, and the
/// positions of the maxima.
fn pool_typed<T: WithDType>(
    x: &[T],
    l: &Layout,
    win: &Window2d,
    kind: PoolKind,
) -> (Vec<T>, Vec<u32>) {
    let ([sn, sc, sh, sw], base) = strides4(l);
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let per_plane = oh * ow;
    let mut out = vec![T::ZERO; win.n * win.c * per_plane];
    let mut ids = vec![0u32; if kind == PoolKind::Max { out.len() } else { 0 }];
    let area = (kh * kw) as f64;
    let pool_plane = |p: usize, dst: &mut [T], ids: Option<&mut [u32]>| {
        let src = base + (p / win.c) * sn + (p % win.c) * sc;
        let mut ids = ids;
        for y in 0..oh {
            for xo in 0..ow {
                let (mut best, mut best_at, mut sum) = (f64::NEG_INFINITY, u32::MAX, 0f64);
                for i in 0..kh {
                    let Some(iy) = tap(win, 0, y, i) else {
                        continue;
                    };
                    for j in 0..kw {
                        let Some(ix) = tap(win, 1, xo, j) else {
                            continue;
                        };
                        let v = x[src + iy * sh + ix * sw].to_f64();
                        sum += v;
                        if best_at == u32::MAX || v > best || (v.is_nan() && !best.is_nan()) {
                            best = v;
                            best_at = (iy * win.w + ix) as u32;
                        }
                    }
                }
                let o = y * ow + xo;
                dst[o] = T::from_f64(match kind {
                    PoolKind::Max => best,
                    PoolKind::Avg => sum / area,
                });
                if let Some(ids) = ids.as_deref_mut() {
                    ids[o] = best_at;
                }
            }
        }
    };
    if kind == PoolKind::Max {
        let work = |(p, (d, i)): (usize, (&mut [T], &mut [u32]))| pool_plane(p, d, Some(i));
        if out.len() >= PARALLEL_THRESHOLD {
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
    } else {
        for_chunks(&mut out, per_plane, |p, d| pool_plane(p, d, None));
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
    for_chunks(&mut out, plane, |p, dst| {
        let src = base + (p / win.c) * sn + (p % win.c) * sc;
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

impl WindowStorage for CpuStorage {
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
