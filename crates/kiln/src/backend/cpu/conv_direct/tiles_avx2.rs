//! The channel kernel on AVX2 CPUs: [`tiles::conv_rows`](super::tiles) with 8-lane vectors
//! and 16 of them. A register tile holds 16 output channels (two vectors) for up to
//! [`MAX_PIXELS_AVX2`] pixels of one output row (12 accumulators, two weight vectors and a
//! broadcast: 15 registers); the packed 32-channel tiles run as two halves of 16. The
//! outputs leave through a small buffer on the stack, one scalar store each: 16·6 stores a
//! tile against 16·6·`taps` multiply-add lanes.

use super::*;
use std::arch::x86_64::*;

/// Pixels of one output row per AVX2 register tile, at most.
pub(super) const MAX_PIXELS_AVX2: usize = 6;
/// Output channels per AVX2 register tile: half of a packed tile.
const HALF: usize = CO_TILE / 2;

/// [`tiles::conv_rows`](super::tiles) on AVX2: each packed 32-channel tile as two
/// 16-channel halves.
///
/// # Safety
/// The CPU has AVX2 and FMA; otherwise as [`tiles::conv_rows`](super::tiles).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn conv_rows_avx2(
    k: &Kernel,
    xp: &[f32],
    out: *mut f32,
    rows: std::ops::Range<usize>,
    next: &mut Prefetch,
) {
    let Kernel {
        geo,
        packed,
        taps,
        bias,
        relu,
        ..
    } = *k;
    let plane = geo.oh * geo.ow;
    let pixel_tiles = geo.ow.div_ceil(MAX_PIXELS_AVX2);
    for r in rows {
        next.step();
        let RowPlace {
            grp,
            gt,
            y,
            co,
            valid,
        } = geo.row(r);
        for half in 0..2 {
            let channels = valid.saturating_sub(half * HALF).min(HALF);
            if channels == 0 {
                break;
            }
            let first = co + half * HALF;
            let mut start = [0f32; HALF];
            if let Some(b) = bias {
                start[..channels].copy_from_slice(&b[first..first + channels]);
            }
            // SAFETY: `start` holds 16 values.
            let init = unsafe {
                [
                    _mm256_loadu_ps(start.as_ptr()),
                    _mm256_loadu_ps(start.as_ptr().add(8)),
                ]
            };
            let tile = Tile2 {
                // SAFETY: the group's channels start inside the padded image.
                x: unsafe {
                    xp.as_ptr()
                        .add(grp * geo.cig * geo.hp * geo.wp + y * geo.stride[0] * geo.wp)
                },
                stride: geo.stride[1],
                taps,
                runs: geo.tap_runs(y),
                kw: geo.kw,
                // SAFETY: tile `gt` of `packed` is `kg·32` values; this half starts 16 in.
                w: unsafe { packed.as_ptr().add(gt * geo.kg * CO_TILE + half * HALF) },
                init,
                relu,
                // SAFETY: channel `first`, row `y` of the image's output.
                out: unsafe { out.add(first * plane + y * geo.ow) },
                plane,
                valid: channels,
            };
            let mut x0 = 0;
            for p in 0..pixel_tiles {
                let n = (geo.ow - x0) / (pixel_tiles - p);
                // SAFETY: pixels x0..x0+n of the row exist, and their taps stay in the
                // padded image (the window's reach fits the padded input).
                unsafe { tile.run_dispatch(x0, n, geo.columns(x0, n)) };
                x0 += n;
            }
        }
    }
}

/// One output row's AVX2 register tiles of 16 channels: everything but the pixels.
struct Tile2<'a> {
    /// The row's first input element (padded image, the group's first channel).
    x: *const f32,
    /// Input columns between neighbouring output pixels.
    stride: usize,
    /// Offset of each tap from a pixel's first input element.
    taps: &'a [usize],
    /// The taps this row runs.
    runs: TapRuns,
    /// Kernel columns (blocks of the tap list).
    kw: usize,
    /// The half tile's packed weights: 16 values every 32, one run a tap.
    w: *const f32,
    /// The accumulators' start: the bias or zeros.
    init: [__m256; 2],
    relu: bool,
    /// The row's first output element in the half's first channel.
    out: *mut f32,
    plane: usize,
    /// Channels of the half that exist.
    valid: usize,
}

impl Tile2<'_> {
    /// Pixels `x0..x0 + n` (`1 ≤ n ≤ MAX_PIXELS_AVX2`), the stride a constant where it is 1.
    ///
    /// # Safety
    /// As [`Tile2::run`].
    #[inline(always)]
    unsafe fn run_dispatch(&self, x0: usize, n: usize, columns: Columns) {
        macro_rules! by_width {
            ($($n:literal)*) => {
                match (n, self.stride == 1) {
                    // SAFETY: forwarded to the caller.
                    $(($n, true) => unsafe { self.run::<$n, true>(x0, columns) },)*
                    // SAFETY: forwarded to the caller.
                    $(($n, false) => unsafe { self.run::<$n, false>(x0, columns) },)*
                    _ => unreachable!("a pixel tile of {n}"),
                }
            };
        }
        by_width!(1 2 3 4 5 6)
    }

    /// `NP` pixels from `x0` through every tap (edge pixels skipping the kernel columns
    /// that read padding only, as the AVX-512 tile does), then bias, ReLU and the stores.
    ///
    /// # Safety
    /// The caller has AVX2 and FMA; pixels `x0..x0 + NP` exist in the row, every tap of each
    /// stays inside the padded image, and the half's channels and pixels are writable.
    #[inline(always)]
    unsafe fn run<const NP: usize, const UNIT_STRIDE: bool>(&self, x0: usize, columns: Columns) {
        let stride = if UNIT_STRIDE { 1 } else { self.stride };
        // SAFETY: (the whole body) the caller's guarantees: the taps stay in the padded
        // image, the packed weights hold 16 values of this half per tap, and the outputs
        // are in bounds.
        unsafe {
            let mut acc = [self.init; NP];
            let x = self.x.add(x0 * stride);
            let runs = self.runs;
            let mut at = (runs.start, 0);
            let edge = columns.skips(0).0 > 0 || columns.skips(self.kw - 1).1 > 0;
            if UNIT_STRIDE && edge {
                let taps = runs.per_column(self.kw);
                for col in 0..self.kw {
                    let (left, right) = columns.skips(col);
                    macro_rules! skipping {
                        ($(($l:literal, $r:literal))*) => {
                            match (left, right) {
                                _ if left + right >= NP => {
                                    for _ in 0..taps {
                                        at = runs.next(at.0, at.1);
                                    }
                                }
                                $(($l, $r) => self.column::<NP, $l, $r>(&mut acc, x, stride, &mut at, taps),)*
                                // Wider edges multiply the padding's zeros.
                                _ => self.column::<NP, 0, 0>(&mut acc, x, stride, &mut at, taps),
                            }
                        };
                    }
                    skipping!((0, 0)(1, 0)(2, 0)(3, 0)(0, 1)(0, 2)(0, 3));
                }
            } else {
                self.column::<NP, 0, 0>(&mut acc, x, stride, &mut at, runs.count());
            }
            let zero = _mm256_setzero_ps();
            let mut values = [[0f32; HALF]; NP];
            for (v, a) in values.iter_mut().zip(&acc) {
                for (k, &a) in a.iter().enumerate() {
                    // max(0, v) keeps a NaN (the second operand wins when one is NaN).
                    let a = if self.relu { _mm256_max_ps(zero, a) } else { a };
                    _mm256_storeu_ps(v.as_mut_ptr().add(8 * k), a);
                }
            }
            for c in 0..self.valid {
                let dst = self.out.add(c * self.plane + x0);
                for (p, v) in values.iter().enumerate() {
                    *dst.add(p) = v[c];
                }
            }
        }
    }

    /// `taps` taps from `at` (advanced), multiplied into pixels `LEFT..NP - RIGHT` of `acc`
    /// (`walk_tap_runs!`). (A list of each row's (weight, input) offsets made once a row
    /// instead of walking `TapRuns` ran 3% slower.)
    ///
    /// # Safety
    /// As [`Tile2::run`]; the taps stay within the row's runs.
    #[inline(always)]
    unsafe fn column<const NP: usize, const LEFT: usize, const RIGHT: usize>(
        &self,
        acc: &mut [[__m256; 2]; NP],
        x: *const f32,
        stride: usize,
        at: &mut (usize, usize),
        taps: usize,
    ) {
        // The prefetch runs 8 taps ahead in the list, into the gap after a run at its end
        // (a hint: those weights are other rows').
        const WEIGHTS_AHEAD: usize = 8;
        walk_tap_runs!(self.runs, at, taps, |t| {
            // SAFETY: the caller's guarantees; every tap index is below `kg`.
            unsafe {
                let w = self.w.add(t * CO_TILE);
                let w0 = _mm256_loadu_ps(w);
                let w1 = _mm256_loadu_ps(w.add(8));
                _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(WEIGHTS_AHEAD * CO_TILE).cast());
                let xt = x.add(*self.taps.get_unchecked(t));
                for (p, a) in acc.iter_mut().enumerate().take(NP - RIGHT).skip(LEFT) {
                    let v = _mm256_broadcast_ss(&*xt.add(p * stride));
                    a[0] = _mm256_fmadd_ps(w0, v, a[0]);
                    a[1] = _mm256_fmadd_ps(w1, v, a[1]);
                }
            }
        });
    }
}

/// [`tiles::pixel_rows`](super::tiles) on AVX2: a tile holds the packed tile's 8 channels
/// (one broadcast weight each) × one vector of 8 pixels of an output row: 8 accumulators,
/// and per tap one vector of inputs and 8 broadcasts for 8 multiply-adds.
///
/// # Safety
/// The CPU has AVX2 and FMA; otherwise as [`tiles::pixel_rows`](super::tiles).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pixel_rows_avx2(
    k: &Kernel,
    xp: &[f32],
    out: *mut f32,
    rows: std::ops::Range<usize>,
    next: &mut Prefetch,
) {
    let Kernel {
        geo,
        packed,
        taps,
        bias,
        relu,
        ..
    } = *k;
    let plane = geo.oh * geo.ow;
    for r in rows {
        next.step();
        let RowPlace {
            grp,
            gt,
            y,
            co,
            valid,
        } = geo.row(r);
        let mut init = [0f32; PIXEL_CO_TILE];
        if let Some(b) = bias {
            init[..valid].copy_from_slice(&b[co..co + valid]);
        }
        let tile = PixelTile2 {
            x: xp[grp * geo.cig * geo.hp * geo.wp + y * geo.stride[0] * geo.wp..].as_ptr(),
            taps,
            runs: geo.tap_runs(y),
            w: packed[gt * geo.kg * PIXEL_CO_TILE..].as_ptr(),
            init,
            relu,
            // SAFETY: channel `co`, row `y` of the image's output.
            out: unsafe { out.add(co * plane + y * geo.ow) },
            plane,
            valid,
        };
        let mut x0 = 0;
        while x0 < geo.ow {
            let n = (geo.ow - x0).min(8);
            // SAFETY: pixels x0..x0+n of the row exist; with a horizontal stride of 1 each
            // tap of each stays inside its padded row (the window fits the padded input).
            unsafe {
                if n == 8 {
                    tile.run::<true>(x0, 8)
                } else {
                    tile.run::<false>(x0, n)
                }
            }
            x0 += n;
        }
    }
}

/// One output row's tiles of the AVX2 pixel kernel: everything but the pixels.
struct PixelTile2<'a> {
    /// The row's first input element (padded image, the group's first channel).
    x: *const f32,
    /// Offset of each tap from a pixel's first input element.
    taps: &'a [usize],
    /// The taps this row runs.
    runs: TapRuns,
    /// The tile's packed weights, `[taps][8]`.
    w: *const f32,
    /// The accumulators' start per channel: the bias or zeros.
    init: [f32; PIXEL_CO_TILE],
    relu: bool,
    /// The row's first output element in the tile's first channel.
    out: *mut f32,
    plane: usize,
    /// Channels of the tile that exist.
    valid: usize,
}

impl PixelTile2<'_> {
    /// Pixels `x0..x0 + n` (`n ≤ 8`; `FULL` where `n = 8`, the others through masked loads
    /// and stores).
    ///
    /// # Safety
    /// The caller has AVX2 and FMA; the pixels exist in the row, their taps stay in the
    /// padded image, and the tile's valid channels are writable at those pixels.
    #[inline(always)]
    unsafe fn run<const FULL: bool>(&self, x0: usize, n: usize) {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
        // SAFETY: (the whole body) the caller's guarantees; masked-off lanes are neither read
        // nor written. Every tap index is below `kg`.
        unsafe {
            let mut acc: [__m256; PIXEL_CO_TILE] =
                std::array::from_fn(|c| _mm256_set1_ps(self.init[c]));
            let x = self.x.add(x0);
            let runs = self.runs;
            let (mut t, mut j) = (runs.start, 0);
            for _ in 0..runs.count() {
                let w = self.w.add(t * PIXEL_CO_TILE);
                let xt = x.add(*self.taps.get_unchecked(t));
                let xv = if FULL {
                    _mm256_loadu_ps(xt)
                } else {
                    _mm256_maskload_ps(xt, mask)
                };
                for (c, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(&*w.add(c)), *a);
                }
                (t, j) = runs.next(t, j);
            }
            let zero = _mm256_setzero_ps();
            for (c, &a) in acc.iter().enumerate().take(self.valid) {
                let dst = self.out.add(c * self.plane + x0);
                // max(0, v) keeps a NaN, as in the channel kernel.
                let a = if self.relu { _mm256_max_ps(zero, a) } else { a };
                if FULL {
                    _mm256_storeu_ps(dst, a);
                } else {
                    _mm256_maskstore_ps(dst, mask, a);
                }
            }
        }
    }
}
