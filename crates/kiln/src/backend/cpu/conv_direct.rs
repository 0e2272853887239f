//! Direct f32 convolutions for AVX-512 CPUs, without an unfolded matrix.
//!
//! Each image is copied once into a zero-padded scratch (`[c, h + 2·ph, w + 2·pw]`), so
//! every tap of every output pixel is one fixed offset from the pixel's corner. A register
//! tile holds 32 output channels (two vectors) for up to 14 pixels of one output row (28 of
//! the 32 vector registers): for each tap `(ci, kh, kw)` it loads the tile's 32 weights
//! (packed once per call, `[group][tile][ci·kh·kw][32]`), broadcasts each pixel's input
//! value and issues two fused multiply-adds per pixel. Bias and ReLU are applied before the
//! tile is transposed in registers and stored into the NCHW output, one run of pixels per
//! channel.
//!
//! Measured on the 2-core EPYC (Zen 5, 274 GFLOP/s per core of FMA peak): 32→64 channels,
//! 14², 5×5 runs at 255–260 GFLOP/s per core, against 205 for the `gemm` crate on the
//! unfolded matrix (`conv.rs`), before that path's unfold and packing.
//!
//! Convolutions with few taps per channel (fewer than [`MIN_TAPS`]: a 3-channel image, a
//! 1-channel first layer) or 8–15 channels a group use the pixel kernel instead, where the
//! stores would cost as much as the arithmetic: a tile holds 8 output channels × up to 48
//! pixels (three vectors) of one output row, loads the pixels' input values as vectors,
//! broadcasts each channel's weight, and stores each channel's pixels as vectors. It needs a
//! horizontal stride of 1.
//!
//! The input gradient of a stride-1 convolution is the same kernel over the output gradient
//! with the weight flipped and its channel axes swapped ([`backward_input`]).
//!
//! `KILN_CPU_CONV=unfold` (read once) turns the direct path off, for A/B runs and tests.

use super::conv::images_per_task;
use super::threads::{install, num_threads};
use crate::layout::Layout;
use crate::op::Window2d;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Output channels per register tile of the channel kernel: two 16-lane vectors.
const CO_TILE: usize = 32;
/// Output channels per register tile of the pixel kernel (one broadcast weight each).
const PIXEL_CO_TILE: usize = 8;
/// Pixels of one output row per tile of the pixel kernel, at most: three vectors.
const PIXEL_RUN: usize = 48;
/// Pixels of one output row per register tile, at most.
const MAX_PIXELS: usize = 14;
/// Taps per output channel from which the channel kernel pays: with fewer, storing each
/// tile's outputs costs about as much as its multiply-adds (1→32 channels, 5×5: 4.3
/// against 2.5 ms through the unfolded matrix, batch 256 at 28², 2 cores).
const MIN_TAPS: usize = 64;

/// Whether the direct kernels run on this CPU: AVX-512, and not turned off by
/// `KILN_CPU_CONV=unfold`.
pub(crate) fn enabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("KILN_CPU_CONV").is_ok_and(|v| v == "unfold"));
    !off && cfg!(target_arch = "x86_64")
        && super::simd::simd_level() == super::simd::SimdLevel::Avx512
}

/// Which register tile a convolution runs with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TileKind {
    /// 32 channels (vectors) × up to 14 pixels (broadcasts), transposed into the output.
    Channels,
    /// 8 channels (broadcasts) × up to 48 pixels (vectors), stored as they are.
    Pixels,
}

/// The shape of one call, in the terms the tiles use.
struct Geometry {
    kind: TileKind,
    /// Padded input plane: rows, columns.
    hp: usize,
    wp: usize,
    oh: usize,
    ow: usize,
    stride: [usize; 2],
    groups: usize,
    /// Input and output channels per group.
    cig: usize,
    cg: usize,
    /// Register tiles of output channels per group.
    tiles: usize,
    /// Taps per output channel: `cig·kh·kw`.
    kg: usize,
}

impl Geometry {
    /// Output rows of one image, counted over (group, channel tile, row).
    fn rows(&self) -> usize {
        self.groups * self.tiles * self.oh
    }

    /// Where output row `r` (counted as in [`Geometry::rows`]) lies: its (group·tiles + tile)
    /// index, image row, first output channel and how many of the tile's channels exist.
    fn row(&self, r: usize) -> RowPlace {
        let (gt, y) = (r / self.oh, r % self.oh);
        let (grp, t) = (gt / self.tiles, gt % self.tiles);
        let co_tile = self.co_tile();
        RowPlace {
            grp,
            gt,
            y,
            co: grp * self.cg + t * co_tile,
            valid: co_tile.min(self.cg - t * co_tile),
        }
    }

    /// Output channels per tile.
    fn co_tile(&self) -> usize {
        match self.kind {
            TileKind::Channels => CO_TILE,
            TileKind::Pixels => PIXEL_CO_TILE,
        }
    }
}

/// One call's kernel: everything the tiles read but the image and the output.
#[derive(Clone, Copy)]
struct Kernel<'a> {
    geo: &'a Geometry,
    /// The weights packed for `geo`'s tiles ([`pack_weights`]).
    packed: &'a [f32],
    /// Each tap's offset from a pixel's first input element in the padded image.
    taps: &'a [usize],
    /// `groups·cg` values, or none.
    bias: Option<&'a [f32]>,
    relu: bool,
}

/// See [`Geometry::row`].
struct RowPlace {
    grp: usize,
    gt: usize,
    y: usize,
    co: usize,
    valid: usize,
}

/// `y = act(conv(x, w) + bias)` (`[n, c_out, oh, ow]`, contiguous) for f32 on AVX-512, or
/// `None` where the direct kernels do not apply: another CPU; fewer than 8 output channels
/// per group; fewer than 16 channels or [`MIN_TAPS`] taps per channel with a horizontal
/// stride above 1. `w` is contiguous.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    x: &[f32],
    xl: &Layout,
    w: &[f32],
    win: &Window2d,
    groups: usize,
    c_out: usize,
    bias: Option<&[f32]>,
    relu: bool,
) -> Option<Vec<f32>> {
    let [oh, ow] = win.out_hw();
    let plane = oh * ow;
    let cg = c_out / groups;
    let [kh, kw] = win.kernel;
    let kg = win.c / groups * kh * kw;
    let kind = if cg >= 16 && kg >= MIN_TAPS {
        TileKind::Channels
    } else if cg >= PIXEL_CO_TILE && win.stride[1] == 1 {
        TileKind::Pixels
    } else {
        return None;
    };
    if !enabled() {
        return None;
    }
    let (hp, wp) = (win.h + 2 * win.padding[0], win.w + 2 * win.padding[1]);
    let cig = win.c / groups;
    let geo = Geometry {
        kind,
        hp,
        wp,
        oh,
        ow,
        stride: win.stride,
        groups,
        cig,
        cg,
        tiles: cg.div_ceil(match kind {
            TileKind::Channels => CO_TILE,
            TileKind::Pixels => PIXEL_CO_TILE,
        }),
        kg,
    };
    let packed = pack_weights(w, &geo);
    let taps: Vec<usize> = (0..cig)
        .flat_map(|ci| (0..kh).flat_map(move |i| (0..kw).map(move |j| (ci, i, j))))
        .map(|(ci, i, j)| ci * hp * wp + i * win.dilation[0] * wp + j * win.dilation[1])
        .collect();
    let per_image = c_out * plane;
    // Every element is written once by the tiles, so the output is not zeroed first (a
    // memset of the whole batch's output, 1 ms of 12 on the CNN's second layer).
    let mut out = Vec::<f32>::with_capacity(win.n * per_image);
    let spare = &mut out.spare_capacity_mut()[..win.n * per_image];
    let scratch_len = win.c * hp * wp;
    let threads = num_threads().max(1);
    let kernel = Kernel {
        geo: &geo,
        packed: &packed,
        taps: &taps,
        bias,
        relu,
    };
    let run_rows = |xp: &[f32], y: OutPtr, rows: std::ops::Range<usize>| {
        // SAFETY: the level check in `enabled` found AVX-512; `xp` is a padded image of
        // `geo`, `packed` and `taps` were made for `geo`, and `y` points at an image's
        // `c_out·oh·ow` outputs, of which these rows are written by this call alone.
        unsafe { kernel_rows(&kernel, xp, y.0, rows) }
    };
    if win.n >= threads {
        let run = images_per_task(win.n);
        install(|| {
            spare
                .par_chunks_mut(run * per_image)
                .enumerate()
                .for_each(|(r, images)| {
                    let mut xp = vec![0f32; scratch_len];
                    for (i, y) in images.chunks_mut(per_image).enumerate() {
                        pad_image(x, xl, win, r * run + i, &mut xp);
                        run_rows(&xp, OutPtr(y.as_mut_ptr().cast()), 0..geo.rows());
                    }
                })
        });
    } else {
        // Fewer images than threads (a batch of one): the rows of each image are shared.
        let mut xp = vec![0f32; scratch_len];
        let rows = geo.rows();
        let per_task = rows.div_ceil(threads);
        for (b, y) in spare.chunks_mut(per_image).enumerate() {
            pad_image(x, xl, win, b, &mut xp);
            let y = OutPtr(y.as_mut_ptr().cast());
            install(|| {
                (0..rows)
                    .step_by(per_task)
                    .collect::<Vec<_>>()
                    .into_par_iter()
                    .for_each(|start| run_rows(&xp, y, start..(start + per_task).min(rows)))
            });
        }
    }
    // SAFETY: the rows of every image cover each (channel, row, pixel) of the output once
    // (every channel tile, output row and pixel tile; the masks keep each channel below
    // `c_out`), so all `n·per_image` elements have been written.
    unsafe { out.set_len(win.n * per_image) };
    Some(out)
}

/// The input gradient of a stride-1 convolution as a direct convolution of the output
/// gradient `g` (`gl`, `[n, c_out, oh, ow]`) with the flipped weight (channel axes swapped)
/// and padding `dilation·(k − 1) − padding`; `None` where that does not apply (strides
/// above 1, padding wider than the kernel's reach, or [`forward`]'s conditions).
pub(super) fn backward_input(
    g: &[f32],
    gl: &Layout,
    w: &[f32],
    win: &Window2d,
    groups: usize,
    c_out: usize,
) -> Option<Vec<f32>> {
    let [kh, kw] = win.kernel;
    let reach = [win.dilation[0] * (kh - 1), win.dilation[1] * (kw - 1)];
    if win.stride != [1, 1] || win.padding[0] > reach[0] || win.padding[1] > reach[1] {
        return None;
    }
    let [oh, ow] = win.out_hw();
    let (cg, cig) = (c_out / groups, win.c / groups);
    if !enabled() || cig < 16 {
        return None;
    }
    // flipped[grp·cig + i][o][a][b] = w[grp·cg + o][i][kh − 1 − a][kw − 1 − b]
    let mut flipped = vec![0f32; w.len()];
    for grp in 0..groups {
        for o in 0..cg {
            for i in 0..cig {
                let src = &w[((grp * cg + o) * cig + i) * kh * kw..][..kh * kw];
                let dst = &mut flipped[((grp * cig + i) * cg + o) * kh * kw..][..kh * kw];
                for (d, s) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = *s;
                }
            }
        }
    }
    let transposed = Window2d {
        n: win.n,
        c: c_out,
        h: oh,
        w: ow,
        kernel: win.kernel,
        stride: [1, 1],
        padding: [reach[0] - win.padding[0], reach[1] - win.padding[1]],
        dilation: win.dilation,
    };
    debug_assert_eq!(transposed.out_hw(), [win.h, win.w]);
    forward(g, gl, &flipped, &transposed, groups, win.c, None, false)
}

/// The weight `[c_out, cig, kh, kw]` (contiguous) as `[group][tile][cig·kh·kw][co_tile]`,
/// the channels past the group's last one zero.
fn pack_weights(w: &[f32], geo: &Geometry) -> Vec<f32> {
    let co_tile = geo.co_tile();
    let mut packed = vec![0f32; geo.groups * geo.tiles * geo.kg * co_tile];
    for (gt, dst) in packed.chunks_exact_mut(geo.kg * co_tile).enumerate() {
        let (grp, t) = (gt / geo.tiles, gt % geo.tiles);
        for lane in 0..co_tile.min(geo.cg - t * co_tile) {
            let co = grp * geo.cg + t * co_tile + lane;
            for (k, &v) in w[co * geo.kg..(co + 1) * geo.kg].iter().enumerate() {
                dst[k * co_tile + lane] = v;
            }
        }
    }
    packed
}

/// Image `b` of `x` (any strides) into `xp`, `[c, h + 2·ph, w + 2·pw]` with zero borders.
fn pad_image(x: &[f32], l: &Layout, win: &Window2d, b: usize, xp: &mut [f32]) {
    let s = l.strides();
    let [ph, pw] = win.padding;
    let wp = win.w + 2 * pw;
    let hp = win.h + 2 * ph;
    xp.fill(0.0);
    for ci in 0..win.c {
        for y in 0..win.h {
            let src = l.offset() + b * s[0] + ci * s[1] + y * s[2];
            let dst = &mut xp[(ci * hp + y + ph) * wp + pw..][..win.w];
            if s[3] == 1 {
                dst.copy_from_slice(&x[src..src + win.w]);
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = x[src + j * s[3]];
                }
            }
        }
    }
}

/// An image's output, written by several threads at disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every thread writes only the rows it was handed (`conv_rows`), so the pointer is
// shared without two threads touching one element.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Output rows `rows` (counted over (group, channel tile, row)) of one image.
///
/// # Safety
/// The CPU has AVX-512F; `xp` is an image padded for `k.geo` (`c·hp·wp` elements), the
/// rest of `k` was made for `k.geo` (as in [`forward`]), and `out` points at
/// `groups·cg·oh·ow` writable elements no other thread writes in these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn conv_rows(k: &Kernel, xp: &[f32], out: *mut f32, rows: std::ops::Range<usize>) {
    let Kernel {
        geo,
        packed,
        taps,
        bias,
        relu,
    } = *k;
    use std::arch::x86_64::*;
    let plane = geo.oh * geo.ow;
    let pixel_tiles = geo.ow.div_ceil(MAX_PIXELS);
    for r in rows {
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
            unsafe { tile.run_dispatch(x0, n) };
            x0 += n;
        }
    }
}

/// Output rows `rows` of one image with the kernel `geo.kind` names.
///
/// # Safety
/// As [`conv_rows`] (and [`pixel_rows`] for the pixel kernel).
unsafe fn kernel_rows(k: &Kernel, xp: &[f32], out: *mut f32, rows: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded to the caller.
    unsafe {
        match k.geo.kind {
            TileKind::Channels => conv_rows(k, xp, out, rows),
            TileKind::Pixels => pixel_rows(k, xp, out, rows),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, xp, out, rows);
        unreachable!("the direct convolution runs only where `enabled` found AVX-512")
    }
}

#[cfg(target_arch = "x86_64")]
fn lane_mask(valid: usize) -> u16 {
    if valid >= 16 {
        u16::MAX
    } else {
        (1u16 << valid) - 1
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
    unsafe fn run_dispatch(&self, x0: usize, n: usize) {
        macro_rules! by_width {
            ($($n:literal)*) => {
                match (n, self.stride == 1) {
                    // SAFETY: forwarded to the caller.
                    $(($n, true) => unsafe { self.run::<$n, true>(x0) },)*
                    // SAFETY: forwarded to the caller.
                    $(($n, false) => unsafe { self.run::<$n, false>(x0) },)*
                    _ => unreachable!("a pixel tile of {n}"),
                }
            };
        }
        by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
    }

    /// `NP` pixels from `x0`: 2·NP accumulators through every tap, then bias, ReLU and a
    /// transpose into runs of pixels, stored per channel.
    ///
    /// # Safety
    /// The caller has AVX-512F; pixels `x0..x0 + NP` exist in the row, every tap of each
    /// stays inside the padded image, and the tile's channels and pixels are writable.
    #[inline(always)]
    unsafe fn run<const NP: usize, const UNIT_STRIDE: bool>(&self, x0: usize) {
        use std::arch::x86_64::*;
        // A constant stride of 1 lets each broadcast address its pixel as `x + p` (a
        // run-time stride needs one register per pixel and ran at 65% of the rate).
        let stride = if UNIT_STRIDE { 1 } else { self.stride };
        // SAFETY: (the whole body) the caller's guarantees: the taps stay in the padded
        // image, the packed weights hold 32 values per tap, and the outputs are in bounds.
        unsafe {
            let mut acc = [self.init; NP];
            let x = self.x.add(x0 * stride);
            let mut w = self.w;
            for &t in self.taps {
                let w0 = _mm512_loadu_ps(w);
                let w1 = _mm512_loadu_ps(w.add(16));
                let xt = x.add(t);
                for (p, a) in acc.iter_mut().enumerate() {
                    let v = _mm512_set1_ps(*xt.add(p * stride));
                    a[0] = _mm512_fmadd_ps(w0, v, a[0]);
                    a[1] = _mm512_fmadd_ps(w1, v, a[1]);
                }
                w = w.add(CO_TILE);
            }
            // Each half (16 channels × NP pixels) transposed in registers, then one masked
            // store of NP pixels per channel: 64 shuffles and 16 stores where a scatter per
            // pixel cost about 8% of the tile at 800 taps (A/B in the results README).
            let zero = _mm512_setzero_ps();
            let pixels = lane_mask(NP);
            for half in 0..2 {
                let channels = self.valid.saturating_sub(half * 16).min(16);
                if channels == 0 {
                    break;
                }
                let mut rows = [zero; 16];
                for (r, a) in rows.iter_mut().zip(&acc) {
                    // max(0, v) keeps a NaN (the second operand wins when one is NaN).
                    *r = if self.relu {
                        _mm512_max_ps(zero, a[half])
                    } else {
                        a[half]
                    };
                }
                transpose16(&mut rows);
                for (c, &r) in rows.iter().enumerate().take(channels) {
                    let dst = self.out.add((half * 16 + c) * self.plane + x0);
                    _mm512_mask_storeu_ps(dst, pixels, r);
                }
            }
        }
    }
}

/// Transposes a 16×16 block of f32 held as 16 row vectors.
///
/// # Safety
/// The caller has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    // SAFETY: register shuffles only; the caller has AVX-512F.
    unsafe {
        let mut t = [_mm512_setzero_ps(); 16];
        // 32-bit interleave of row pairs.
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // 64-bit interleave of those pairs' pairs.
        let (lo, hi) = (
            |a: __m512, b: __m512| {
                _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
            },
            |a: __m512, b: __m512| {
                _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
            },
        );
        for i in 0..4 {
            let q = 4 * i;
            r[q] = lo(t[q], t[q + 2]);
            r[q + 1] = hi(t[q], t[q + 2]);
            r[q + 2] = lo(t[q + 1], t[q + 3]);
            r[q + 3] = hi(t[q + 1], t[q + 3]);
        }
        // 128-bit blocks: rows k and k + 4 of each group of eight.
        for g in 0..2 {
            let b = 8 * g;
            for k in 0..4 {
                t[b + k] = _mm512_shuffle_f32x4::<0x88>(r[b + k], r[b + k + 4]);
                t[b + k + 4] = _mm512_shuffle_f32x4::<0xdd>(r[b + k], r[b + k + 4]);
            }
        }
        // 128-bit blocks across the two groups of eight.
        for k in 0..8 {
            r[k] = _mm512_shuffle_f32x4::<0x88>(t[k], t[k + 8]);
            r[k + 8] = _mm512_shuffle_f32x4::<0xdd>(t[k], t[k + 8]);
        }
    }
}

/// [`conv_rows`] for [`TileKind::Pixels`]: 8 channels × up to [`PIXEL_RUN`] pixels a tile.
///
/// # Safety
/// As [`conv_rows`], with a horizontal stride of 1 and `packed` made for 8-channel tiles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pixel_rows(k: &Kernel, xp: &[f32], out: *mut f32, rows: std::ops::Range<usize>) {
    let Kernel {
        geo,
        packed,
        taps,
        bias,
        relu,
    } = *k;
    let plane = geo.oh * geo.ow;
    for r in rows {
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
        // read nor written, and their addresses are formed with wrapping arithmetic.
        unsafe {
            let mut acc: [[__m512; NV]; PIXEL_CO_TILE] =
                std::array::from_fn(|c| [_mm512_set1_ps(self.init[c]); NV]);
            let x = self.x.add(x0);
            let mut w = self.w;
            for &t in self.taps {
                let xt = x.add(t);
                let xv: [__m512; NV] = std::array::from_fn(|v| {
                    _mm512_maskz_loadu_ps(masks[v], xt.wrapping_add(16 * v))
                });
                for (c, a) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*w.add(c));
                    for (av, &xv) in a.iter_mut().zip(&xv) {
                        *av = _mm512_fmadd_ps(xv, b, *av);
                    }
                }
                w = w.add(PIXEL_CO_TILE);
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

/// Filter rows `(ci, kh)` one weight-gradient tile covers for a filter row of `kw` taps:
/// at most 20 accumulators (2 vectors per tap) and 4 row pointers. With 24 (4 rows of 3
/// taps) the compiler spilled accumulators to the stack inside the pixel loop.
const fn rows_per_tile(kw: usize) -> usize {
    let r = 10 / kw;
    if r > 4 {
        4
    } else {
        r
    }
}

/// The weight gradient `[c_out, c_in, kh, kw]` of a stride-1, undilated, ungrouped
/// convolution from the input `x` (`xl`) and the output gradient `g` (`gl`), or `None`
/// where that does not apply (or [`enabled`] is false, or there are fewer than 16 output
/// channels or [`MIN_TAPS`] taps per channel, or filter rows of more than 7 taps; 1→32
/// channels, 5×5, 28², batch 256 took 4.7 ms here against 4.0 through the unfolded matrix).
///
/// Per image: the padded input and the gradient transposed to `[pixel][channel]` (so 32
/// channels of one pixel are two vector loads); a register tile holds 32 channels for every
/// tap of [`rows_per_tile`] filter rows and walks every pixel, broadcasting each tap's input
/// value. Each task sums its run of images into its own accumulators; the runs' sums are
/// added at the end.
pub(super) fn backward_weight(
    x: &[f32],
    xl: &Layout,
    g: &[f32],
    gl: &Layout,
    win: &Window2d,
    groups: usize,
    c_out: usize,
) -> Option<Vec<f32>> {
    let [kh, kw] = win.kernel;
    if !enabled()
        || groups != 1
        || win.stride != [1, 1]
        || win.dilation != [1, 1]
        || kw > 7
        || c_out < 16
    {
        return None;
    }
    let [oh, ow] = win.out_hw();
    let (hp, wp) = (win.h + 2 * win.padding[0], win.w + 2 * win.padding[1]);
    let tiles = c_out.div_ceil(CO_TILE);
    let rows = win.c * kh;
    let per_tile = rows_per_tile(kw);
    let row_tiles = rows.div_ceil(per_tile);
    // Each filter row's first input element in the padded image; the last tile's rows past
    // the end repeat row 0 (their sums are dropped).
    let row_offsets: Vec<usize> = (0..row_tiles * per_tile)
        .map(|r| {
            if r < rows {
                (r / kh) * hp * wp + (r % kh) * wp
            } else {
                0
            }
        })
        .collect();
    let sums_len = tiles * row_tiles * per_tile * kw * CO_TILE;
    // Tasks: runs of whole images; with fewer images than threads, bands of one image's
    // output rows instead (a batch of one would otherwise run on one core).
    let threads = num_threads().max(1);
    let tasks: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> = if win.n >= threads {
        let run = images_per_task(win.n);
        (0..win.n)
            .step_by(run)
            .map(|b| (b..(b + run).min(win.n), 0..oh))
            .collect()
    } else {
        let band = oh.div_ceil(threads);
        (0..win.n)
            .flat_map(|b| {
                (0..oh)
                    .step_by(band)
                    .map(move |y| (b..b + 1, y..(y + band).min(oh)))
            })
            .collect()
    };
    let shape = GradShape {
        ow,
        wp,
        kw,
        tiles,
        row_tiles,
    };
    let partials = install(|| {
        tasks
            .par_iter()
            .map(|(images, band)| {
                let mut sums = vec![0f32; sums_len];
                let mut xp = vec![0f32; win.c * hp * wp];
                let mut gt = vec![0f32; band.len() * ow * tiles * CO_TILE];
                for b in images.clone() {
                    pad_image(x, xl, win, b, &mut xp);
                    transpose_grad(g, gl, b, c_out, tiles * CO_TILE, band.clone(), &mut gt);
                    // SAFETY: `enabled` found AVX-512; `xp`, `gt`, `row_offsets` and
                    // `sums` were sized above for `shape` and this band of rows.
                    unsafe {
                        weight_grad_image(&xp, &gt, &shape, band.clone(), &row_offsets, &mut sums)
                    };
                }
                sums
            })
            .collect::<Vec<_>>()
    });
    let mut dw = vec![0f32; c_out * rows * kw];
    for sums in partials {
        for co in 0..c_out {
            let (t, lane) = (co / CO_TILE, co % CO_TILE);
            for row in 0..rows {
                for j in 0..kw {
                    let tap = (t * row_tiles * per_tile + row) * kw + j;
                    dw[(co * rows + row) * kw + j] += sums[tap * CO_TILE + lane];
                }
            }
        }
    }
    Some(dw)
}

/// What [`weight_grad_image`] needs of the convolution.
struct GradShape {
    ow: usize,
    /// Padded input row length.
    wp: usize,
    kw: usize,
    /// Tiles of 32 output channels.
    tiles: usize,
    /// Tiles of [`rows_per_tile`] filter rows.
    row_tiles: usize,
}

/// Output rows `band` of image `b` of the output gradient (any strides) as
/// `[band·ow][channels]` (`channels` a multiple of 32; those past `c_out` stay as they are,
/// zero).
fn transpose_grad(
    g: &[f32],
    gl: &Layout,
    b: usize,
    c_out: usize,
    channels: usize,
    band: std::ops::Range<usize>,
    gt: &mut [f32],
) {
    let (d, s) = (gl.dims(), gl.strides());
    let ow = d[3];
    let base = gl.offset() + b * s[0];
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if s[3] == 1 && (s[2] == ow || d[2] == 1) {
        // SAFETY: `backward_weight` runs only where `enabled` found AVX-512; the plane is
        // contiguous (checked), so each channel's band is one run of `band.len()·ow`.
        done = unsafe {
            transpose_blocks(
                &g[base..],
                s[1],
                c_out,
                band.start * ow,
                band.len() * ow,
                channels,
                gt,
            )
        };
    }
    for co in done..c_out {
        for y in band.clone() {
            let src = base + co * s[1] + y * s[2];
            for xo in 0..ow {
                gt[((y - band.start) * ow + xo) * channels + co] = g[src + xo * s[3]];
            }
        }
    }
}

/// [`transpose_grad`] for a contiguous plane, by 16×16 blocks in registers: pixels
/// `first..first + len` of every channel below the last whole block of 16. Returns the
/// channels done (a multiple of 16).
///
/// # Safety
/// The CPU has AVX-512F; `g` holds channel `c` at `c·channel_stride`, each with at least
/// `first + len` pixels; `gt` holds `len·channels` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_blocks(
    g: &[f32],
    channel_stride: usize,
    c_out: usize,
    first: usize,
    len: usize,
    channels: usize,
    gt: &mut [f32],
) -> usize {
    use std::arch::x86_64::*;
    let blocks = c_out / 16;
    for cb in 0..blocks {
        let mut q = 0;
        while q < len {
            let n = (len - q).min(16);
            let mask = lane_mask(n);
            // SAFETY: pixels first+q .. first+q+n of channels 16·cb .. 16·cb+16 are in `g`
            // (masked past n); the n pixel rows of `gt` hold `channels ≥ 16·cb + 16` each.
            unsafe {
                let mut rows: [__m512; 16] = std::array::from_fn(|i| {
                    let src = g.as_ptr().add((16 * cb + i) * channel_stride + first + q);
                    _mm512_maskz_loadu_ps(mask, src)
                });
                transpose16(&mut rows);
                for (j, r) in rows.iter().enumerate().take(n) {
                    _mm512_storeu_ps(gt.as_mut_ptr().add((q + j) * channels + 16 * cb), *r);
                }
            }
            q += n;
        }
    }
    blocks * 16
}

/// Adds the weight gradient of output rows `band` of one image into `sums`
/// (`[tile][row tile][row][kw][32]`).
///
/// # Safety
/// The CPU has AVX-512F; `xp` is the padded image, `gt` the transposed gradient, and
/// `row_offsets` and `sums` were made for `shape` (as in [`backward_weight`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weight_grad_image(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    row_offsets: &[usize],
    sums: &mut [f32],
) {
    macro_rules! by_width {
        ($($kw:literal)*) => {
            match shape.kw {
                // SAFETY: forwarded from the caller.
                $($kw => unsafe {
                    weight_grad_tiles::<$kw, { rows_per_tile($kw) }>(xp, gt, shape, band.clone(), row_offsets, sums)
                },)*
                _ => unreachable!("filter rows of {} taps", shape.kw),
            }
        };
    }
    by_width!(1 2 3 4 5 6 7)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn weight_grad_image(
    _: &[f32],
    _: &[f32],
    _: &GradShape,
    _: std::ops::Range<usize>,
    _: &[usize],
    _: &mut [f32],
) {
    unreachable!("the direct convolution runs only where `enabled` found AVX-512")
}

/// [`weight_grad_image`] for filter rows of `KW` taps, `R` rows a tile.
///
/// # Safety
/// As [`weight_grad_image`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weight_grad_tiles<const KW: usize, const R: usize>(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    row_offsets: &[usize],
    sums: &mut [f32],
) {
    use std::arch::x86_64::*;
    let channels = shape.tiles * CO_TILE;
    // SAFETY: (the whole body) every tap of every pixel stays in the padded image (a
    // stride-1 window: oh + kh − 1 = hp, ow + kw − 1 = wp), `gt` holds `band·ow·channels`
    // values and `sums` `tiles·row_tiles·R·KW·32`.
    unsafe {
        // Output rows in chunks of about 256 pixels, every tile walking one chunk before the
        // next: the chunk's transposed gradient stays in cache for all of them (a 224-wide
        // image's 6 MB streamed once per tile took 2 of the weight gradient's 2.4 ms).
        let chunk_rows = (256 / shape.ow).max(1);
        for y0 in band.clone().step_by(chunk_rows) {
            let chunk = y0..(y0 + chunk_rows).min(band.end);
            for t in 0..shape.tiles {
                for rt in 0..shape.row_tiles {
                    let s = sums
                        .as_mut_ptr()
                        .add((t * shape.row_tiles + rt) * R * KW * CO_TILE);
                    let mut acc = [[[_mm512_setzero_ps(); 2]; KW]; R];
                    for (r, row) in acc.iter_mut().enumerate() {
                        for (j, a) in row.iter_mut().enumerate() {
                            let p = s.add((r * KW + j) * CO_TILE);
                            *a = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
                        }
                    }
                    let offsets = &row_offsets[rt * R..(rt + 1) * R];
                    for y in chunk.clone() {
                        let grow = gt
                            .as_ptr()
                            .add((y - band.start) * shape.ow * channels + t * CO_TILE);
                        let xrows: [*const f32; R] =
                            std::array::from_fn(|r| xp.as_ptr().add(offsets[r] + y * shape.wp));
                        for xo in 0..shape.ow {
                            let g0 = _mm512_loadu_ps(grow.add(xo * channels));
                            let g1 = _mm512_loadu_ps(grow.add(xo * channels + 16));
                            for (r, row) in acc.iter_mut().enumerate() {
                                for (j, a) in row.iter_mut().enumerate() {
                                    let v = _mm512_set1_ps(*xrows[r].add(xo + j));
                                    a[0] = _mm512_fmadd_ps(g0, v, a[0]);
                                    a[1] = _mm512_fmadd_ps(g1, v, a[1]);
                                }
                            }
                        }
                    }
                    for (r, row) in acc.iter().enumerate() {
                        for (j, a) in row.iter().enumerate() {
                            let p = s.add((r * KW + j) * CO_TILE);
                            _mm512_storeu_ps(p, a[0]);
                            _mm512_storeu_ps(p.add(16), a[1]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #[test]
    fn transpose16_transposes() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        use std::arch::x86_64::*;
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        // SAFETY: AVX-512F checked above; loads and stores of 16 floats within `m`/`out`.
        let out = unsafe {
            let mut rows: [__m512; 16] =
                std::array::from_fn(|i| _mm512_loadu_ps(m[16 * i..].as_ptr()));
            super::transpose16(&mut rows);
            let mut out = vec![0f32; 256];
            for (i, r) in rows.iter().enumerate() {
                _mm512_storeu_ps(out[16 * i..].as_mut_ptr(), *r);
            }
            out
        };
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(out[16 * i + j], m[16 * j + i], "element ({i}, {j})");
            }
        }
    }
}
