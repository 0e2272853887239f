//! The direct weight gradient's tiles on AVX2 CPUs: [`weight_grad`](super::weight_grad)'s
//! walk with 8-lane vectors, each packed 32-channel tile as two halves of 16 channels, and
//! at most [`rows_per_tile_avx2`] filter rows a tile (12 accumulators of the 16 registers).

use super::weight_grad::{chunk_rows, GradShape};
use super::*;
use crate::backend::cpu::simd::transpose::transpose_tile_avx2;
use std::arch::x86_64::*;

/// Filter rows one AVX2 tile covers for a filter row of `kw` taps (at most 5): at most 10
/// accumulators (2 vectors per tap), with the gradient's two vectors and a broadcast. With
/// 12 (two rows of 3 taps) the compiler kept the accumulators on the stack: b32 32→64 28²
/// 3×3 took 19.4 ms against 16.7 through the unfolded matrix.
pub(super) const fn rows_per_tile_avx2(kw: usize) -> usize {
    let r = 5 / kw;
    if r > 4 {
        4
    } else {
        r
    }
}

/// [`weight_grad`](super::weight_grad)'s `weight_grad_image` on AVX2.
///
/// # Safety
/// The CPU has AVX2 and FMA; `shape.kw ≤ 5`; otherwise as `weight_grad_image`, with `sums`
/// laid out for [`rows_per_tile_avx2`] rows a tile.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weight_grad_image_avx2(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    sums: &mut [f32],
    prefetch: &mut [Prefetch; 2],
) {
    macro_rules! by_width {
        ($($kw:literal)*) => {
            match shape.kw {
                // SAFETY: forwarded from the caller.
                $($kw => unsafe {
                    weight_grad_tiles_avx2::<$kw, { rows_per_tile_avx2($kw) }>(xp, gt, shape, band.clone(), sums, prefetch)
                },)*
                _ => unreachable!("filter rows of {} taps on AVX2", shape.kw),
            }
        };
    }
    by_width!(1 2 3 4 5)
}

/// [`weight_grad_image_avx2`] for filter rows of `KW` taps, `R` rows a tile.
///
/// # Safety
/// As [`weight_grad_image_avx2`].
#[inline(always)]
unsafe fn weight_grad_tiles_avx2<const KW: usize, const R: usize>(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    sums: &mut [f32],
    prefetch: &mut [Prefetch; 2],
) {
    let channels = shape.tiles * CO_TILE;
    let inner = shape.inner_pixels();
    let edges: Vec<usize> = (0..inner.start).chain(inner.end..shape.ow).collect();
    // SAFETY: (the whole body) every tap of every pixel stays in the padded image (a
    // stride-1 window), `gt` holds `band·ow·channels` values and `sums`
    // `tiles·row_tiles·R·KW·32`.
    unsafe {
        for y0 in band.clone().step_by(chunk_rows(shape.ow)) {
            let chunk = y0..(y0 + chunk_rows(shape.ow)).min(band.end);
            for t in 0..shape.tiles {
                for rt in 0..shape.row_tiles {
                    prefetch.iter_mut().for_each(Prefetch::step);
                    let offsets = &shape.row_offsets[rt * R..(rt + 1) * R];
                    let rows =
                        chunk.start.max(shape.reach[rt].start)..chunk.end.min(shape.reach[rt].end);
                    for half in 0..2 {
                        let s = sums
                            .as_mut_ptr()
                            .add((t * shape.row_tiles + rt) * R * KW * CO_TILE + half * 16);
                        let mut acc = [[[_mm256_setzero_ps(); 2]; KW]; R];
                        for (r, row) in acc.iter_mut().enumerate() {
                            for (j, a) in row.iter_mut().enumerate() {
                                let p = s.add((r * KW + j) * CO_TILE);
                                *a = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))];
                            }
                        }
                        for y in rows.clone() {
                            let grow = gt.as_ptr().add(
                                (y - band.start) * shape.ow * channels + t * CO_TILE + half * 16,
                            );
                            let xrows: [*const f32; R] =
                                std::array::from_fn(|r| xp.as_ptr().add(offsets[r] + y * shape.wp));
                            let g = |xo: usize| {
                                let g = grow.add(xo * channels);
                                [_mm256_loadu_ps(g), _mm256_loadu_ps(g.add(8))]
                            };
                            if KW == 5 && R == 1 {
                                // Ten accumulators, two gradient vectors and the five
                                // broadcasts the compiler hoists ahead of the FMAs do not
                                // fit 16 registers: one accumulator went through the stack
                                // every pixel. Two passes of taps (0–2, 3–4) left the
                                // second pass four chains of 5-cycle FMAs on Zen 1. The
                                // pixel is written out instead: 13 registers, one
                                // broadcast at a time, each accumulator's sum in the same
                                // order (b256 32→64 14² 5×5 weight + bias gradient,
                                // alternated: 79.3–82.1 → 75.2–76.4 ms). Letting the
                                // compiler schedule five of the ten accumulators a pass, or
                                // two pixels into two sets, ran 25–40% slower.
                                let row = &mut acc[0][..];
                                for xo in inner.clone() {
                                    grad_pixel5_avx2(
                                        row,
                                        grow.add(xo * channels),
                                        xrows[0].add(xo),
                                    );
                                }
                            } else {
                                for xo in inner.clone() {
                                    grad_pixel_avx2::<KW, R, 0, 0>(&mut acc, g(xo), &xrows, xo);
                                }
                            }
                            for &xo in &edges {
                                macro_rules! skipping {
                                    ($(($l:literal, $r:literal))*) => {
                                        match shape.edge_skips(xo) {
                                            (l, r) if l + r >= KW => {}
                                            $(($l, $r) => grad_pixel_avx2::<KW, R, $l, $r>(&mut acc, g(xo), &xrows, xo),)*
                                            // Wider edges multiply the padding's zeros.
                                            _ => grad_pixel_avx2::<KW, R, 0, 0>(&mut acc, g(xo), &xrows, xo),
                                        }
                                    };
                                }
                                skipping!((1, 0)(2, 0)(3, 0)(0, 1)(0, 2)(0, 3));
                            }
                        }
                        for (r, row) in acc.iter().enumerate() {
                            for (j, a) in row.iter().enumerate() {
                                let p = s.add((r * KW + j) * CO_TILE);
                                _mm256_storeu_ps(p, a[0]);
                                _mm256_storeu_ps(p.add(8), a[1]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One output pixel's gradient `g` (16 channels) times its input at taps `LEFT..KW − RIGHT`
/// of each filter row, into `acc`.
///
/// # Safety
/// The caller has AVX2 and FMA; `xrows[r] + xo + j` is inside the padded image for each
/// tap `j`.
#[inline(always)]
unsafe fn grad_pixel_avx2<
    const KW: usize,
    const R: usize,
    const LEFT: usize,
    const RIGHT: usize,
>(
    acc: &mut [[[__m256; 2]; KW]; R],
    g: [__m256; 2],
    xrows: &[*const f32; R],
    xo: usize,
) {
    for (r, row) in acc.iter_mut().enumerate() {
        for (j, a) in row.iter_mut().enumerate().take(KW - RIGHT).skip(LEFT) {
            // SAFETY: the caller's guarantee.
            let v = _mm256_broadcast_ss(unsafe { &*xrows[r].add(xo + j) });
            a[0] = _mm256_fmadd_ps(g[0], v, a[0]);
            a[1] = _mm256_fmadd_ps(g[1], v, a[1]);
        }
    }
}

/// [`grad_pixel_avx2`] for one filter row of five taps, all of them: `acc[j]` (16 channels,
/// two vectors) += the 16 gradient values at `g` × the input at `x + j`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `acc` holds 5 taps; `g` 16 values; `x` 5.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn grad_pixel5_avx2(acc: &mut [[__m256; 2]], g: *const f32, x: *const f32) {
    let a = &mut acc[..5];
    // SAFETY: the caller's guarantees: the asm reads 16 floats at `g` and 5 at `x`, writes
    // only its register operands, and touches neither the stack nor the flags.
    unsafe {
        std::arch::asm!(
            "vmovups {g0}, ymmword ptr [{g}]",
            "vmovups {g1}, ymmword ptr [{g} + 32]",
            "vbroadcastss {b}, dword ptr [{x}]",
            "vfmadd231ps {a00}, {g0}, {b}",
            "vfmadd231ps {a01}, {g1}, {b}",
            "vbroadcastss {b}, dword ptr [{x} + 4]",
            "vfmadd231ps {a10}, {g0}, {b}",
            "vfmadd231ps {a11}, {g1}, {b}",
            "vbroadcastss {b}, dword ptr [{x} + 8]",
            "vfmadd231ps {a20}, {g0}, {b}",
            "vfmadd231ps {a21}, {g1}, {b}",
            "vbroadcastss {b}, dword ptr [{x} + 12]",
            "vfmadd231ps {a30}, {g0}, {b}",
            "vfmadd231ps {a31}, {g1}, {b}",
            "vbroadcastss {b}, dword ptr [{x} + 16]",
            "vfmadd231ps {a40}, {g0}, {b}",
            "vfmadd231ps {a41}, {g1}, {b}",
            g = in(reg) g,
            x = in(reg) x,
            g0 = out(ymm_reg) _,
            g1 = out(ymm_reg) _,
            b = out(ymm_reg) _,
            a00 = inout(ymm_reg) a[0][0],
            a01 = inout(ymm_reg) a[0][1],
            a10 = inout(ymm_reg) a[1][0],
            a11 = inout(ymm_reg) a[1][1],
            a20 = inout(ymm_reg) a[2][0],
            a21 = inout(ymm_reg) a[2][1],
            a30 = inout(ymm_reg) a[3][0],
            a31 = inout(ymm_reg) a[3][1],
            a40 = inout(ymm_reg) a[4][0],
            a41 = inout(ymm_reg) a[4][1],
            options(nostack, readonly, preserves_flags),
        );
    }
}

/// [`weight_grad`](super::weight_grad)'s `transpose_blocks` on AVX2: whole 16×16 blocks by
/// register transposes, the pixels past the last whole block one by one. Returns the
/// channels done (a multiple of 16).
///
/// # Safety
/// The CPU has AVX2; `g` holds channel `c` at `c·channel_stride`, each with at least
/// `first + len` pixels; `gt` holds `len·channels` values.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_blocks_avx2(
    g: &[f32],
    channel_stride: usize,
    c_out: usize,
    first: usize,
    len: usize,
    channels: usize,
    gt: &mut [f32],
) -> usize {
    let blocks = c_out / 16;
    let whole = len / 16 * 16;
    for cb in 0..blocks {
        let src = |c: usize, q: usize| (16 * cb + c) * channel_stride + first + q;
        for q in (0..whole).step_by(16) {
            // SAFETY: pixels first+q .. +16 of channels 16·cb .. +16 are in `g`; the 16
            // pixel rows of `gt` from q hold `channels ≥ 16·cb + 16` each.
            unsafe {
                transpose_tile_avx2(
                    g.as_ptr().add(src(0, q)),
                    channel_stride,
                    gt.as_mut_ptr().add(q * channels + 16 * cb),
                    channels,
                )
            };
        }
        for q in whole..len {
            for c in 0..16 {
                gt[q * channels + 16 * cb + c] = g[src(c, q)];
            }
        }
    }
    blocks * 16
}
