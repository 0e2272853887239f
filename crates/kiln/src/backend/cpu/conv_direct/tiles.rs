//! The forward register tiles: the channel kernel ([`conv_rows`], 32 channels × up to 14
//! pixels, transposed into the output) and the pixel kernel ([`pixel_rows`], 8 channels × up
//! to 48 pixels, stored as they are).

use super::*;

/// Output rows `rows` (counted over (group, channel tile, row)) of one image, stepping
/// `next` (the next image's input) once a row.
///
/// # Safety
/// The CPU has AVX-512F; `xp` is an image padded for `k.geo` (`c·hp·wp` elements), the
/// rest of `k` was made for `k.geo` (as in [`forward`]), and `out` points at
/// `groups·cg·oh·ow` writable elements no other thread writes in these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn conv_rows(
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
    use std::arch::x86_64::*;
    let plane = geo.oh * geo.ow;
    let pixel_tiles = geo.ow.div_ceil(MAX_PIXELS);
    for r in rows {
        next.step();
        let RowPlace {
            grp,
            gt,
            y,
            co,
            valid,
        } = geo.row(r);
        let masks = [lane_mask(valid), lane_mask(valid.saturating_sub(16))];
        let init = match bias {
            // SAFETY: `bias` holds every channel of the group; the masks stop at `valid`.
            Some(b) => unsafe {
                [
                    _mm512_maskz_loadu_ps(masks[0], b.as_ptr().add(co)),
                    _mm512_maskz_loadu_ps(masks[1], b.as_ptr().wrapping_add(co + 16)),
                ]
            },
            None => [_mm512_setzero_ps(); 2],
        };
        let tile = Tile {
            // SAFETY: the group's channels start inside the padded image.
            x: unsafe {
                xp.as_ptr()
                    .add(grp * geo.cig * geo.hp * geo.wp + y * geo.stride[0] * geo.wp)
            },
            stride: geo.stride[1],
            taps,
            runs: geo.tap_runs(y),
            kw: geo.kw,
            // SAFETY: tile `gt` of `packed` is `kg·32` values.
            w: unsafe { packed.as_ptr().add(gt * geo.kg * CO_TILE) },
            init,
            relu,
            // SAFETY: channel `co`, row `y` of the image's output.
            out: unsafe { out.add(co * plane + y * geo.ow) },
            plane,
            valid,
        };
        let mut x0 = 0;
        for p in 0..pixel_tiles {
            let n = (geo.ow - x0) / (pixel_tiles - p);
            // SAFETY: pixels x0..x0+n of the row exist, and their taps stay in the padded
            // image (the window's reach fits the padded input: `Window2d::new`).
            unsafe { tile.run_dispatch(x0, n, geo.columns(x0, n)) };
            x0 += n;
        }
    }
}

/// One output row's register tiles: everything but the pixels.
#[cfg(target_arch = "x86_64")]
struct Tile<'a> {
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
    /// The tile's packed weights, `[taps][32]`.
    w: *const f32,
    /// The accumulators' start: the bias or zeros.
    init: [std::arch::x86_64::__m512; 2],
    relu: bool,
    /// The row's first output element in the tile's first channel.
    out: *mut f32,
    plane: usize,
    /// Channels of the tile that exist.
    valid: usize,
}

#[cfg(target_arch = "x86_64")]
impl Tile<'_> {
    /// Pixels `x0..x0 + n` (`1 ≤ n ≤ MAX_PIXELS`), with the stride as a constant where it is 1.
    ///
    /// # Safety
    /// As [`Tile::run`]; the caller has AVX-512F.
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
        by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
    }

    /// `NP` pixels from `x0`: 2·NP accumulators through every tap, then bias, ReLU and a
    /// transpose into runs of pixels, stored per channel. With a stride of 1, the pixels of
    /// an edge tile that read only padding at a kernel column skip that column's taps
    /// (`columns`): 6 of 70 pixel-columns of a 14-wide row under a 5×5 window with padding 2.
    ///
    /// # Safety
    /// The caller has AVX-512F; pixels `x0..x0 + NP` exist in the row, every tap of each
    /// stays inside the padded image, and the tile's channels and pixels are writable.
    #[inline(always)]
    unsafe fn run<const NP: usize, const UNIT_STRIDE: bool>(&self, x0: usize, columns: Columns) {
        use std::arch::x86_64::*;
        // A constant stride of 1 lets each broadcast address its pixel as `x + p` (a
        // run-time stride needs one register per pixel and ran at 65% of the rate).
        let stride = if UNIT_STRIDE { 1 } else { self.stride };
        // SAFETY: (the whole body) the caller's guarantees: the taps stay in the padded
        // image, the packed weights hold 32 values per tap, and the outputs are in bounds.
        unsafe {
            // The outputs' lines are fetched for writing now, while the taps run: stored
            // cold after them, a large batch's fresh output stalled each tile on its
            // stores' misses.
            for c in 0..self.valid {
                let dst = self.out.add(c * self.plane + x0);
                _mm_prefetch::<_MM_HINT_ET0>(dst.cast());
                _mm_prefetch::<_MM_HINT_ET0>(dst.add(NP - 1).cast());
            }
            let mut acc = [self.init; NP];
            let x = self.x.add(x0 * stride);
            let runs = self.runs;
            let mut at = (runs.start, 0);
            // Skips fall from the first kernel column to the last on the left, rise on the
            // right.
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
            // Each half (16 channels × NP pixels) transposed in registers, then one masked
            // store of NP pixels per channel: 64 shuffles and 16 stores where a scatter per
            // pixel cost about 8% of the tile at 800 taps (A/B in the results README).
            let zero = _mm512_setzero_ps();
            let pixels = lane_mask(NP);
            // The halves taken apart at constant indices: indexing `acc` by the loop's
            // `half` kept it in memory, with a store after every multiply-add above (28
            // stores a tap, which the store port absorbed: no measurable change on Zen 4).
            let halves: [[__m512; NP]; 2] = [
                std::array::from_fn(|p| acc[p][0]),
                std::array::from_fn(|p| acc[p][1]),
            ];
            for (half, values) in halves.iter().enumerate() {
                let channels = self.valid.saturating_sub(half * 16).min(16);
                if channels == 0 {
                    break;
                }
                let mut rows = [zero; 16];
                for (r, &a) in rows.iter_mut().zip(values) {
                    // max(0, v) keeps a NaN (the second operand wins when one is NaN).
                    *r = if self.relu { _mm512_max_ps(zero, a) } else { a };
                }
                transpose16(&mut rows);
                for (c, &r) in rows.iter().enumerate().take(channels) {
                    let dst = self.out.add((half * 16 + c) * self.plane + x0);
                    _mm512_mask_storeu_ps(dst, pixels, r);
                }
            }
        }
    }

    /// `taps` taps from `at` (the tap and its place in its run, advanced), multiplied into
    /// pixels `LEFT..NP - RIGHT` of `acc`: the others read padding at these taps.
    ///
    /// # Safety
    /// As [`Tile::run`]; the taps stay within the row's runs.
    #[inline(always)]
    unsafe fn column<const NP: usize, const LEFT: usize, const RIGHT: usize>(
        &self,
        acc: &mut [[std::arch::x86_64::__m512; 2]; NP],
        x: *const f32,
        stride: usize,
        at: &mut (usize, usize),
        taps: usize,
    ) {
        use std::arch::x86_64::*;
        // Weights fetched this many taps ahead: 234-236 → 239-242 GFLOP/s on one core of the
        // 2-core EPYC (b256 32→64 14² 5×5); 16 and 32 taps ran the same. Into the gap after
        // a run at its end (a hint: those weights are other rows').
        const WEIGHTS_AHEAD: usize = 8;
        walk_tap_runs!(self.runs, at, taps, |t| {
            // SAFETY: the caller's guarantees; every tap index is below `kg` (`tap_runs` keeps
            // each run inside its block of taps).
            unsafe {
                let w = self.w.add(t * CO_TILE);
                let w0 = _mm512_loadu_ps(w);
                let w1 = _mm512_loadu_ps(w.add(16));
                let ahead = w.wrapping_add(WEIGHTS_AHEAD * CO_TILE);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(16).cast());
                let xt = x.add(*self.taps.get_unchecked(t));
                for (p, a) in acc.iter_mut().enumerate().take(NP - RIGHT).skip(LEFT) {
                    let v = _mm512_set1_ps(*xt.add(p * stride));
                    a[0] = _mm512_fmadd_ps(w0, v, a[0]);
                    a[1] = _mm512_fmadd_ps(w1, v, a[1]);
                }
            }
        });
    }
}

/// [`conv_rows`] for [`TileKind::Pixels`]: 8 channels × up to [`PIXEL_RUN`] pixels a tile.
///
/// # Safety
/// As [`conv_rows`], with a horizontal stride of 1 and `packed` made for 8-channel tiles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pixel_rows(
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
        let tile = PixelTile {
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
            let n = (geo.ow - x0).min(PIXEL_RUN);
            let vectors = n.div_ceil(16);
            let tail = lane_mask(n - (vectors - 1) * 16);
            // SAFETY: pixels x0..x0+n of the row exist; with a horizontal stride of 1 each
            // tap of each stays inside its padded row (the window fits the padded input).
            unsafe {
                match vectors {
                    1 => tile.run::<1>(x0, tail),
                    2 => tile.run::<2>(x0, tail),
                    _ => tile.run::<3>(x0, tail),
                }
            }
            x0 += n;
        }
    }
}

/// One output row's tiles of the pixel kernel: everything but the pixels.
#[cfg(target_arch = "x86_64")]
struct PixelTile<'a> {
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

#[cfg(target_arch = "x86_64")]
impl PixelTile<'_> {
    /// `NV` vectors of pixels from `x0`, the last one masked by `tail`.
    ///
    /// # Safety
    /// The caller has AVX-512F; the unmasked pixels exist in the row, their taps stay in the
    /// padded image, and the tile's valid channels are writable at those pixels.
    #[inline(always)]
    unsafe fn run<const NV: usize>(&self, x0: usize, tail: u16) {
        use std::arch::x86_64::*;
        let masks: [u16; NV] = std::array::from_fn(|v| if v + 1 == NV { tail } else { u16::MAX });
        // SAFETY: (the whole body) the caller's guarantees; masked-off lanes are neither
        // read nor written, and their addresses are formed with wrapping arithmetic. Every
        // tap index is below `kg` (`tap_runs` keeps each run inside its channel's taps).
        unsafe {
            let mut acc: [[__m512; NV]; PIXEL_CO_TILE] =
                std::array::from_fn(|c| [_mm512_set1_ps(self.init[c]); NV]);
            let x = self.x.add(x0);
            let runs = self.runs;
            let (mut t, mut j) = (runs.start, 0);
            for _ in 0..runs.count() {
                let w = self.w.add(t * PIXEL_CO_TILE);
                let xt = x.add(*self.taps.get_unchecked(t));
                let xv: [__m512; NV] = std::array::from_fn(|v| {
                    _mm512_maskz_loadu_ps(masks[v], xt.wrapping_add(16 * v))
                });
                for (c, a) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*w.add(c));
                    for (av, &xv) in a.iter_mut().zip(&xv) {
                        *av = _mm512_fmadd_ps(xv, b, *av);
                    }
                }
                (t, j) = runs.next(t, j);
            }
            let zero = _mm512_setzero_ps();
            for (c, a) in acc.iter().enumerate().take(self.valid) {
                let dst = self.out.add(c * self.plane + x0);
                for (v, &av) in a.iter().enumerate() {
                    // max(0, v) keeps a NaN, as in the channel kernel.
                    let av = if self.relu {
                        _mm512_max_ps(zero, av)
                    } else {
                        av
                    };
                    _mm512_mask_storeu_ps(dst.wrapping_add(16 * v), masks[v], av);
                }
            }
        }
    }
}
