//! Direct f32 convolutions for AVX-512 and AVX2 CPUs, without an unfolded matrix.
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
//! unfolded matrix (`conv.rs`), before that path's unfold and packing. Kernel rows that read
//! only padding are skipped ([`Geometry::tap_runs`]): on a Zen 4 core (116 GFLOP/s of FMA
//! peak) the same problem went from 48.8 to 46.1 ms a batch (one thread), 102 GFLOP/s of
//! useful work. So are the edge pixels of a kernel column that reads only padding there
//! ([`Columns`]; taps ordered by kernel column): two threads, 21.5 → 20.0 ms. The weight
//! gradient skips both the same way ([`backward_weight`]).
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
//! AVX2 CPUs (16 vector registers of 8 lanes) run the same walks with smaller tiles
//! (`tiles_avx2.rs`, `weight_grad_avx2.rs`): 16 channels (half a packed tile) × up to 6
//! pixels for the channel kernel, 8 channels × 8 pixels for the pixel kernel, at most 10
//! accumulators for the weight gradient. On a 2-core Zen 1 EPYC (40 GFLOP/s of FMA peak a
//! core), against the unfolded matrix through `gemm`: b256 32→64 14² 5×5 forward 95 → 72–75
//! ms (PyTorch 69.5), b1 3→64 224² 3×3 forward 7.8 → 3.5 ms (PyTorch 4.4), b256 1→32 28² 5×5
//! 13.2 → 9.3 ms (PyTorch 20.7). Walking the channel tile's taps run by run (a plain count
//! inside a run, no per-tap select of the next tap) took the 14² forward from 62.0–64.5 to
//! 56.5–58.4 ms on a later Zen 1 host (alternated, `cpu_micro conv`), where PyTorch took 53.2;
//! rows whose kernel rows all run walking them in one loop took it from 68.0–70.8 to
//! 64.8–67.8 ms in a slower hour of that host.
//! Both tiles walk their taps through one macro (`walk_tap_runs!`); on an AVX-512 Xeon
//! (two pinned cores of a shared host, alternated, best of five) the AVX-512 tile's walk
//! without per-tap selects took the 14² forward from 16.8 to 14.2 ms and 64→32 from 17.7 to
//! 15.3 (bench/results/2026-11-29p-h200-session47).
//!
//! Stride-1 3×3 and 5×5 layers with 16 or more channels on AVX-512 go through Winograd
//! instead ([`super::conv_winograd`]; `KILN_CPU_CONV=direct` keeps them here).
//!
//! `KILN_CPU_CONV=unfold` (read once) turns the direct path off, for A/B runs and tests.

// The register tiles are x86-64 code; elsewhere (aarch64) every layer takes the unfold path
// and the planning types they share stay unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_variables))]

use super::chunked::for_each_chunk_mut;
use super::conv::images_per_task;
use super::disjoint::DisjointPtr;
#[cfg(target_arch = "x86_64")]
use super::simd::transpose::transpose16;
use super::threads::{install, num_threads};
use crate::layout::Layout;
use crate::op::Window2d;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Runs `$body` for `$taps` taps of `$runs` (a [`TapRuns`]) from `$at` (the tap and its
/// place in its run, advanced), with `$tap` the tap's index: the channel tiles' inner walk.
/// A macro rather than a function taking a closure, so that the body's intrinsics are
/// inlined into the caller's `target_feature` function.
///
/// Run by run, so that the inner loop only counts: the per-tap selects of the next tap and
/// of the prefetch's target filled the issue slots the multiply-adds left on Zen 1 (AVX2,
/// b256 32→64 14² 5×5 forward, two threads: 62.5–63.7 → 57.9–58.4 ms). Rows whose kernel
/// rows all run (10 of a 14² 5×5 layer's 14) join their runs into one loop (68.0–70.8 →
/// 64.8–67.8 ms in a slower hour); whole runs of 3 or 4 taps (the rows next to the padding)
/// are unrolled, the next channel one add away (64.6–65.5 → 63.4–64.2 ms).
#[cfg(target_arch = "x86_64")]
macro_rules! walk_tap_runs {
    ($runs:expr, $at:expr, $taps:expr, |$tap:ident| $body:block) => {{
        let runs: TapRuns = $runs;
        let at: &mut (usize, usize) = $at;
        let (mut t, mut j) = *at;
        let mut left: usize = $taps;
        'walk: {
            if runs.len == runs.per_channel {
                for $tap in t..t + left $body
                *at = (t + left, (j + left) % runs.len);
                break 'walk;
            }
            if j == 0 && left.is_multiple_of(runs.len) && (runs.len == 3 || runs.len == 4) {
                if runs.len == 3 {
                    for _ in 0..left / 3 {
                        for $tap in t..t + 3 $body
                        t += runs.per_channel;
                    }
                } else {
                    for _ in 0..left / 4 {
                        for $tap in t..t + 4 $body
                        t += runs.per_channel;
                    }
                }
                *at = (t, 0);
                break 'walk;
            }
            while left > 0 {
                let run = (runs.len - j).min(left);
                for $tap in t..t + run $body
                (t, j, left) = (t + run, j + run, left - run);
                if j == runs.len {
                    (t, j) = (t + runs.per_channel - runs.len, 0);
                }
            }
            *at = (t, j);
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod tiles;
#[cfg(target_arch = "x86_64")]
mod tiles_avx2;
mod weight_grad;
#[cfg(target_arch = "x86_64")]
mod weight_grad_avx2;

#[cfg(target_arch = "x86_64")]
use tiles::{conv_rows, pixel_rows};
#[cfg(target_arch = "x86_64")]
use tiles_avx2::{conv_rows_avx2, pixel_rows_avx2};
pub(super) use weight_grad::backward_weight;

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

/// What `KILN_CPU_CONV` (read once) allows: `unfold` turns the direct kernels and Winograd
/// off, `direct` Winograd only.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConvSetting {
    Auto,
    Direct,
    Unfold,
}

fn setting() -> ConvSetting {
    static SETTING: OnceLock<ConvSetting> = OnceLock::new();
    *SETTING.get_or_init(|| match std::env::var("KILN_CPU_CONV").as_deref() {
        Ok("unfold") => ConvSetting::Unfold,
        Ok("direct") => ConvSetting::Direct,
        _ => ConvSetting::Auto,
    })
}

/// Whether the direct kernels run on this CPU: AVX-512 or AVX2 ([`avx512`] says which
/// tiles), and not turned off by `KILN_CPU_CONV=unfold`.
pub(crate) fn enabled() -> bool {
    use super::simd::SimdLevel;
    setting() != ConvSetting::Unfold
        && cfg!(target_arch = "x86_64")
        && matches!(
            super::simd::simd_level(),
            SimdLevel::Avx512 | SimdLevel::Avx2
        )
}

/// Whether the kernels run at AVX-512 (else AVX2: `tiles_avx2`, `weight_grad_avx2`).
fn avx512() -> bool {
    super::simd::simd_level() == super::simd::SimdLevel::Avx512
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
    /// The window's rows and columns, vertical dilation, top padding and unpadded input
    /// height: which kernel rows of an output row read padding only ([`Geometry::tap_runs`]).
    kh: usize,
    kw: usize,
    dil_h: usize,
    pad_h: usize,
    h: usize,
    /// Horizontal dilation, left padding and unpadded input width: which pixels of a tile
    /// read padding only at each kernel column ([`Columns`]).
    dil_w: usize,
    pad_w: usize,
    w: usize,
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

    /// The taps of output row `y` that can reach the image: for each kernel column and input
    /// channel, the kernel rows whose input row is inside it (taps are ordered `[kernel
    /// column][input channel][kernel row]`, [`tap_order`]). The others multiply the
    /// padding's zeros, so the tiles skip them: 6 of 70 kernel rows of a 14² 5×5
    /// convolution with padding 2.
    fn tap_runs(&self, y: usize) -> TapRuns {
        let top = y * self.stride[0];
        // Kernel row i reads padded row top + i·dil, inside the image when it lies in
        // [pad_h, pad_h + h).
        let valid = |i: &usize| (self.pad_h..self.pad_h + self.h).contains(&(top + i * self.dil_h));
        let first = (0..self.kh).find(valid).unwrap_or(self.kh);
        let end = (0..self.kh)
            .rposition(|i| valid(&i))
            .map_or(first, |i| i + 1);
        TapRuns {
            per_channel: self.kh,
            start: first,
            len: end - first,
            channels: self.kw * self.cig,
        }
    }

    /// Where the tile of pixels `x0..x0 + n` of a row meets the horizontal padding.
    fn columns(&self, x0: usize, n: usize) -> Columns {
        Columns {
            first: x0 * self.stride[1],
            last: (x0 + n - 1) * self.stride[1],
            dil: self.dil_w,
            pad: self.pad_w,
            width: self.w,
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
    /// The tiles to run: AVX-512's, or AVX2's (the level read once a call: tests change it
    /// process-wide).
    avx512: bool,
}

/// The taps an output row runs ([`Geometry::tap_runs`]): for each of `channels` runs (one
/// per kernel column and input channel), taps `c·per_channel + start ..` `+ len` of the tap
/// list (and of the packed weights).
#[derive(Clone, Copy)]
struct TapRuns {
    per_channel: usize,
    start: usize,
    len: usize,
    channels: usize,
}

impl TapRuns {
    /// How many taps the row runs.
    fn count(&self) -> usize {
        self.channels * self.len
    }

    /// The tap after tap `t`, the `j`-th of its channel's run, and its place in its run.
    #[inline(always)]
    fn next(&self, t: usize, j: usize) -> (usize, usize) {
        if j + 1 < self.len {
            (t + 1, j + 1)
        } else {
            (t + 1 + self.per_channel - self.len, 0)
        }
    }

    /// How many taps the row runs at one kernel column (of `columns`).
    fn per_column(&self, columns: usize) -> usize {
        self.count() / columns
    }
}

/// The horizontal reach of one tile's pixels ([`Geometry::columns`]), in padded input
/// columns at kernel column 0.
#[derive(Clone, Copy)]
struct Columns {
    /// Input column of the tile's first and last pixel.
    first: usize,
    last: usize,
    /// Horizontal dilation, left padding, unpadded width.
    dil: usize,
    pad: usize,
    width: usize,
}

impl Columns {
    /// How many of the tile's first and last pixels read padding only at kernel column `j`
    /// (pixels one input column apart: a horizontal stride of 1).
    fn skips(&self, j: usize) -> (usize, usize) {
        let (first, last) = (self.first + j * self.dil, self.last + j * self.dil);
        (
            self.pad.saturating_sub(first),
            (last + 1).saturating_sub(self.pad + self.width),
        )
    }
}

/// The order of the taps in the tap list and the packed weights: `(ci, i, j)` (input
/// channel, kernel row, kernel column) goes to `(j·cig + ci)·kh + i`, so that each kernel
/// column's taps form one block (a tile skips its edge pixels per column) and each input
/// channel's kernel rows one run (an output row skips rows of padding).
fn tap_order(geo: &Geometry, ci: usize, i: usize, j: usize) -> usize {
    (j * geo.cig + ci) * geo.kh + i
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
    if setting() == ConvSetting::Auto {
        if let Some(y) = super::conv_winograd::forward(x, xl, w, win, groups, c_out, bias, relu) {
            return Some(y);
        }
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
        kh,
        kw,
        dil_h: win.dilation[0],
        pad_h: win.padding[0],
        h: win.h,
        dil_w: win.dilation[1],
        pad_w: win.padding[1],
        w: win.w,
    };
    let packed_store = pack_weights(w, &geo);
    let packed = packed_store.values();
    let mut taps = vec![0; kg];
    for ci in 0..cig {
        for i in 0..kh {
            for j in 0..kw {
                taps[tap_order(&geo, ci, i, j)] =
                    ci * hp * wp + i * win.dilation[0] * wp + j * win.dilation[1];
            }
        }
    }
    let per_image = c_out * plane;
    // Every element is written once by the tiles, so the output is not zeroed first (a
    // memset of the whole batch's output, 1 ms of 12 on the CNN's second layer).
    let mut out = crate::backend::cpu::host_memory::with_capacity_huge::<f32>(win.n * per_image);
    let spare = &mut out.spare_capacity_mut()[..win.n * per_image];
    let scratch_len = win.c * hp * wp;
    let threads = num_threads().max(1);
    let kernel = Kernel {
        geo: &geo,
        packed,
        taps: &taps,
        bias,
        relu,
        avx512: avx512(),
    };
    let run_rows =
        |xp: &[f32], y: DisjointPtr<f32>, rows: std::ops::Range<usize>, next: &mut Prefetch| {
            // SAFETY: the level check in `enabled` found AVX-512 or AVX2 (`kernel_rows` runs
            // the kernels of the level); `xp` is a padded image of
            // `geo`, `packed` and `taps` were made for `geo`, and `y` points at an image's
            // `c_out·oh·ow` outputs, of which these rows are written by this call alone.
            unsafe { kernel_rows(&kernel, xp, y.0, rows, next) }
        };
    if win.n >= threads {
        let run = images_per_task(win.n);
        for_each_chunk_mut(spare, run * per_image, |r, images| {
            let mut xp = vec![0f32; scratch_len];
            let count = images.len() / per_image;
            for (i, y) in images.chunks_mut(per_image).enumerate() {
                let b = r * run + i;
                pad_image(x, xl, win, b, &mut xp);
                let next = if i + 1 < count { b + 1 } else { win.n };
                let mut next = Prefetch::image(x, xl, next, geo.rows());
                run_rows(
                    &xp,
                    DisjointPtr(y.as_mut_ptr().cast()),
                    0..geo.rows(),
                    &mut next,
                );
            }
        });
    } else {
        // Fewer images than threads (a batch of one): the rows of each image are shared.
        let mut xp = vec![0f32; scratch_len];
        let rows = geo.rows();
        let per_task = rows.div_ceil(threads);
        for (b, y) in spare.chunks_mut(per_image).enumerate() {
            pad_image(x, xl, win, b, &mut xp);
            let y = DisjointPtr(y.as_mut_ptr().cast());
            install(|| {
                (0..rows)
                    .step_by(per_task)
                    .collect::<Vec<_>>()
                    .into_par_iter()
                    .for_each(|start| {
                        let rows = start..(start + per_task).min(rows);
                        run_rows(&xp, y, rows, &mut Prefetch::none())
                    })
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
    let transposed = win.input_gradient_window(c_out)?;
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
    forward(g, gl, &flipped, &transposed, groups, win.c, None, false)
}

/// Packed weights starting on a cache line, so that each tap's 32 channels are two whole
/// lines (and an AVX2 half tile's 16 one) rather than three (two). On the Zen 1 host the AVX2
/// forward measured within its noise either way (72–75 against 74.5 ms, b256 32→64 14²).
struct Packed {
    store: Vec<f32>,
    start: usize,
    len: usize,
}

impl Packed {
    fn values(&self) -> &[f32] {
        &self.store[self.start..self.start + self.len]
    }
}

/// The weight `[c_out, cig, kh, kw]` (contiguous) as `[group][tile][tap][co_tile]`, taps
/// in [`tap_order`], the channels past the group's last one zero.
fn pack_weights(w: &[f32], geo: &Geometry) -> Packed {
    let co_tile = geo.co_tile();
    let len = geo.groups * geo.tiles * geo.kg * co_tile;
    let mut store = vec![0f32; len + 16];
    let start = (64 - store.as_ptr() as usize % 64) % 64 / 4;
    let packed = &mut store[start..start + len];
    let order: Vec<usize> = (0..geo.cig)
        .flat_map(|ci| (0..geo.kh).flat_map(move |i| (0..geo.kw).map(move |j| (ci, i, j))))
        .map(|(ci, i, j)| tap_order(geo, ci, i, j))
        .collect();
    for (gt, dst) in packed.chunks_exact_mut(geo.kg * co_tile).enumerate() {
        let (grp, t) = (gt / geo.tiles, gt % geo.tiles);
        for lane in 0..co_tile.min(geo.cg - t * co_tile) {
            let co = grp * geo.cg + t * co_tile + lane;
            for (&k, &v) in order.iter().zip(&w[co * geo.kg..(co + 1) * geo.kg]) {
                dst[k * co_tile + lane] = v;
            }
        }
    }
    Packed { store, start, len }
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

/// The next image's input, fetched into cache a few lines at a time while this image's tiles
/// run, so that [`pad_image`] (or the gradient's transpose) finds it there: fetched cold, each
/// image's copy stalled on its misses (the weight gradient's transposes took 1.0 of its
/// 12.7 ms, batch 256, 32→64 channels at 14²).
#[derive(Clone, Copy)]
struct Prefetch {
    next: *const f32,
    end: *const f32,
    /// Cache lines per [`Prefetch::step`].
    lines: usize,
}

impl Prefetch {
    fn none() -> Prefetch {
        Prefetch {
            next: std::ptr::null(),
            end: std::ptr::null(),
            lines: 0,
        }
    }

    /// Image `b` of `data` (`[n, c, h, w]`, layout `l`), over `steps` calls of
    /// [`Prefetch::step`]; nothing where `b` is past the batch or the image is not one dense
    /// run of memory.
    fn image(data: &[f32], l: &Layout, b: usize, steps: usize) -> Prefetch {
        let (d, s) = (l.dims(), l.strides());
        let len = d[1] * d[2] * d[3];
        let dense = (s[3] == 1 || d[3] == 1)
            && (s[2] == d[3] || d[2] == 1)
            && (s[1] == d[2] * d[3] || d[1] == 1);
        if b >= d[0] || !dense || len == 0 {
            return Prefetch::none();
        }
        let image = &data[l.offset() + b * s[0]..][..len];
        let range = image.as_ptr_range();
        Prefetch {
            next: range.start,
            end: range.end,
            lines: (len * 4).div_ceil(64).div_ceil(steps.max(1)),
        }
    }

    /// Fetches the next [`Prefetch::lines`] cache lines, if any are left.
    #[inline(always)]
    fn step(&mut self) {
        #[cfg(target_arch = "x86_64")]
        for _ in 0..self.lines {
            if self.next >= self.end {
                return;
            }
            // SAFETY: a hint only; `next` lies inside the image (checked above).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.next.cast(),
                );
            }
            self.next = self.next.wrapping_add(16);
        }
    }
}

/// Output rows `rows` of one image with the kernel `geo.kind` names, stepping `next` once a
/// row.
///
/// # Safety
/// As [`conv_rows`] (and [`pixel_rows`] for the pixel kernel).
unsafe fn kernel_rows(
    k: &Kernel,
    xp: &[f32],
    out: *mut f32,
    rows: std::ops::Range<usize>,
    next: &mut Prefetch,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded to the caller, who found AVX-512 or AVX2 (`enabled`).
    unsafe {
        match (k.geo.kind, k.avx512) {
            (TileKind::Channels, true) => conv_rows(k, xp, out, rows, next),
            (TileKind::Channels, false) => conv_rows_avx2(k, xp, out, rows, next),
            (TileKind::Pixels, true) => pixel_rows(k, xp, out, rows, next),
            (TileKind::Pixels, false) => pixel_rows_avx2(k, xp, out, rows, next),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, xp, out, rows, next);
        unreachable!("the direct convolution runs only where `enabled` found AVX-512 or AVX2")
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
