//! kiln's implicit-GEMM convolution on tensor cores (kernels `conv_mma*` in
//! `kernels/conv_mma.cu`) for layers with at most 64 input channels: the 32→64 layers of a
//! small image network, where cuDNN's kernels leave most of the GPU idle (b32 32→64 28² 3×3
//! with TF32: 21 TFLOP/s on the H100, 2026-11-26). A block stages the input rows of its
//! output pixels once, channel-innermost, and walks the filter's taps with the weights
//! streaming through a ring of shared-memory slots, so no im2col matrix is written. Its
//! pixels are a band of output rows of one image ([`Tiling::Bands`]) or a range of the
//! flattened output that may span images ([`Tiling::Flat`]).
//!
//! Measured on the H100 (2026-11-26, `bench/results/2026-11-26x-h100-conv-mma`), per call
//! against cuDNN: b256 32→64 14² 5×5 forward 0.036 against 0.046 ms in bf16 and 0.053
//! against 0.056 in TF32; b32 32→64 28² 3×3 forward 0.020 against 0.034 (bf16); the input
//! gradients of both in 22–49% less time. Then (2026-11-26, H200,
//! `bench/results/2026-11-26aa-h200-conv-mma-staging`) the band staged on every thread, the
//! filter copied as contiguous runs and a pointer-walking epilogue: 39% fewer instructions,
//! the 14² 5×5 forward 11–13% and the 28² bf16 forward 20% faster. Then (2026-11-27, H100,
//! `bench/results/2026-11-27r-h100-conv-flat`) flat ranges of 192 pixels (262 blocks for 256
//! images of 14², against 256 blocks whose seventh warp holds 4 pixels) and a filter
//! preparation of one block per output channel (4.1–4.4 µs before): the 14² 5×5 TF32
//! forward 0.0528–0.0541 → 0.0493–0.0507 ms.
//!
//! On sm_90 the candidates also include Hopper's warpgroup MMA (`conv_wg*`, flat ranges of
//! 4, 8 or 12 warps): in a standalone A/B on the H100 (2026-11-28, `bench/tools/conv_wgmma`)
//! the 14² 5×5 forward took 0.0324 ms in TF32 and 0.0224 in bf16 with 12 warps (0.0194–0.0198
//! in bf16 once 16-bit outputs left through shared memory, 2026-11-28), against
//! 0.0396 and 0.0273 for mma.sync's flat 6 warps. 16-bit outputs leave both kernels
//! through a shared-memory tile (a warp stores consecutive pixels of one plane): the bf16
//! forward then took 0.0192 ms against 0.0219 on an H200.
//!
//! The filter is rearranged for the kernels before each call, by a kernel of its own or, where
//! the grid is resident at once, inside the convolution's launch (`conv_mma_filter.rs`): a
//! call timed from an idle device, as the bench does, is then one launch: a median 2.2 µs
//! less for the 14² 5×5 TF32 forward in the harness (0.0384–0.0425 ms, H100, 2026-11-28).
//!
//! It runs for f16 and bf16, and for f32 when TF32 is on (`kiln::cuda::set_tf32`); exact f32
//! and f64 stay with cuDNN. The input gradient of a stride-1 convolution is the same kernel
//! on the output gradient with the filter transposed and mirrored.
//!
//! Which path runs is chosen per problem by measurement (`KILN_CONV_MMA=auto`, the default):
//! the first call of a problem times a few band heights and flat ranges against cuDNN on the
//! call's own operands and keeps the fastest (without cuDNN, the fastest of its own plans).
//! `=1` forces these kernels wherever they apply, `=0` never uses them; [`set_conv_engine`]
//! overrides both (the GPU tests force them that way).

use super::cudnn::Direction;
use super::launch::{kernel_names, launch_err, name_for};
use super::window::WindowArgs;
use super::{CudaDevice, CudaStorage};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

const NARROW: [&str; 7] = kernel_names!("conv_mma32");
const WIDE: [&str; 7] = kernel_names!("conv_mma64");
const WG_NARROW: [&str; 7] = kernel_names!("conv_wg32");
const WG_WIDE: [&str; 7] = kernel_names!("conv_wg64");
/// Mirrors `MMA_STAGES` and `WG_STAGES` in conv_mma.cu: weight slots (each a group of taps)
/// of the mma.sync and the warpgroup kernels.
const STAGES: usize = 2;
const WG_STAGES: usize = 3;
/// Pixels per warp (`MMA_WM` m16 tiles) and warps per block (the kernels' launch bounds:
/// 256 threads for mma.sync, 384 for the warpgroup kernels).
const WARP_PIXELS: usize = 32;
const MAX_WARPS: usize = 8;
const WG_MAX_WARPS: usize = 12;
/// Input channels the staged band holds at most.
const MAX_CHANNELS: usize = 64;

/// Which convolution kernels run on CUDA where kiln has its own: its direct kernel (few
/// taps per output channel), its tensor-core kernel (at most 64 input channels) and its
/// few-output-channel kernel (1–3 output channels, such as a first layer's input gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvEngine {
    /// kiln's kernel or cuDNN, whichever measured faster for the problem (the default).
    Measure,
    /// kiln's kernels wherever they apply.
    Kiln,
    /// cuDNN (or im2col + GEMM without it) only.
    Library,
}

/// The forced engine's code, 0 until [`set_conv_engine`] is called; then the environment
/// (`KILN_CONV_DIRECT`, `KILN_CONV_MMA`: `1` forces, `0` never) decides per kernel family.
static ENGINE: AtomicU8 = AtomicU8::new(0);

/// Forces the engine of every later convolution in this process, for tests and
/// measurements; [`ConvEngine::Measure`] restores the default. Choices already measured
/// are kept and used again once `Measure` is back.
///
/// ```no_run
/// kiln::cuda::set_conv_engine(kiln::cuda::ConvEngine::Kiln);
/// ```
pub fn set_conv_engine(engine: ConvEngine) {
    let code = match engine {
        ConvEngine::Measure => 3,
        ConvEngine::Kiln => 1,
        ConvEngine::Library => 2,
    };
    ENGINE.store(code, Ordering::Relaxed);
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Auto,
    Always,
    Never,
}

/// The mode of one of kiln's kernel families: [`set_conv_engine`]'s, else environment
/// variable `var`'s (read once into `cache`).
pub(super) fn mode_of(var: &str, cache: &OnceLock<Mode>) -> Mode {
    match ENGINE.load(Ordering::Relaxed) {
        1 => Mode::Always,
        2 => Mode::Never,
        3 => Mode::Auto,
        _ => *cache.get_or_init(|| {
            let names = [("1", Mode::Always), ("0", Mode::Never)];
            super::env_choice(var, &names, Mode::Auto)
        }),
    }
}

pub(super) fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    mode_of("KILN_CONV_MMA", &MODE)
}

/// Which output pixels a block computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Tiling {
    /// A band of this many output rows of one image (block x = image × band).
    Bands(usize),
    /// This many warps' worth (× 32) of consecutive pixels of the flattened (image, row,
    /// column) output, which may span images: no warp computes pixels past a band's end, and
    /// the block count can be fitted to the SMs (a 14² image is 196 pixels, 7 warps of which
    /// the last holds 4).
    Flat(usize),
}

/// One launch shape of the kernels for a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    tiling: Tiling,
    /// Hopper's warpgroup MMA (`conv_wg*`, sm_90 only, flat ranges of whole warpgroups)
    /// instead of mma.sync (`conv_mma*`).
    warpgroup: bool,
    /// 64 output channels per block (else 32).
    wide: bool,
    /// Input channels rounded up to one MMA step (32 bytes), and the staged row length.
    cin_k: usize,
    pitch: usize,
    /// Taps per weight slot: as many as leave room for the blocks an SM should hold (fewer
    /// barriers).
    tps: usize,
    warps: usize,
    smem: usize,
}

/// Registers a thread may use under the kernels' launch bounds, hence the warps an SM
/// holds: 65536 / (128 · 32) for mma.sync (256 threads, 2 blocks per SM), 65536 / (170 · 32)
/// for the warpgroup kernels (384 threads, 1 block).
const WARPS_PER_SM: usize = 16;
const WG_WARPS_PER_SM: usize = 12;

/// Whether the warpgroup kernels can run on `dev`: `wgmma` exists on sm_90 alone (kiln
/// compiles its kernels for sm_90a there).
fn has_warpgroup_mma(dev: &CudaDevice) -> bool {
    dev.info.compute_capability == (9, 0)
}

impl Plan {
    /// The plan of `tiling` for this problem, `None` where the kernels cannot run it.
    fn new(
        dev: &CudaDevice,
        dtype: DType,
        win: &Window2d,
        c_out: usize,
        tiling: Tiling,
        warpgroup: bool,
    ) -> Option<Plan> {
        let elem = dtype.size_in_bytes();
        let step = 32 / elem;
        let cin_k = win.c.div_ceil(step) * step;
        // An odd number of 16-byte units: the eight rows of an ldmatrix hit distinct banks.
        let units = cin_k * elem / 16;
        let pitch = (units + 1 - units % 2) * 16 / elem;
        let [oh, ow] = win.out_hw();
        let [kh, kw] = win.kernel;
        let bw = (ow - 1) * win.stride[1] + (kw - 1) * win.dilation[1] + 1;
        let span = (kh - 1) * win.dilation[0] + 1;
        let (bh, warps) = match tiling {
            Tiling::Bands(rows) => {
                let bh = (rows - 1) * win.stride[0] + span;
                (bh, (rows * ow).div_ceil(WARP_PIXELS))
            }
            Tiling::Flat(warps) => (flat_band_rows(win, warps * WARP_PIXELS), warps),
        };
        let wide = c_out > 32;
        let channels = if wide { 64 } else { 32 };
        // A staged band row: `bw` pixels of `pitch`, then the kernel's padding.
        let band_row =
            bw * pitch + row_pad_units(bw, ow, win.stride[1], pitch * elem / 16) * 16 / elem;
        // The staged band, then the weight slots: rows of `pitch` for mma.sync, of `cin_k`
        // (16-byte chunks, no padding) for the warpgroup kernels, whose slots start on a
        // 128-byte boundary.
        let smem_of = |tps: usize| match warpgroup {
            false => (bh * band_row + STAGES * tps * channels * pitch) * elem,
            true => (bh * band_row + WG_STAGES * tps * channels * cin_k) * elem + 128,
        };
        // Room for two blocks per SM, or for as many as the registers allow; the warpgroup
        // kernels take whole warpgroups, flat, on sm_90.
        let blocks = match warpgroup {
            false => (WARPS_PER_SM / warps.max(1)).max(2),
            true => (WG_WARPS_PER_SM / warps.max(1)).max(1),
        };
        // mma.sync: 1–8 warps; warpgroup MMA: whole warpgroups up to 12 warps, flat, sm_90.
        let warps_fit = match warpgroup {
            false => (1..=MAX_WARPS).contains(&warps),
            true => {
                has_warpgroup_mma(dev)
                    && (1..=WG_MAX_WARPS).contains(&warps)
                    && warps % 4 == 0
                    && matches!(tiling, Tiling::Flat(_))
            }
        };
        let room = match dev.info.max_shared_per_sm {
            Some(per_sm) => (per_sm / blocks).saturating_sub(1024),
            None => dev.info.max_shared_per_block / 2,
        }
        .min(dev.info.max_shared_per_block);
        let tps = (1..=kh * kw)
            .rev()
            .find(|&t| smem_of(t) <= room)
            .unwrap_or(1);
        // 16-bit outputs leave through a [channel][pixel] tile in the same shared memory
        // (pitch: the block's pixels + 8).
        let out_tile = match elem {
            2 => channels * (warps * WARP_PIXELS + 8) * elem,
            _ => 0,
        };
        let smem = smem_of(tps).max(out_tile);
        // The kernel indexes the prepared filter with 32-bit offsets.
        let filter_fits = [channels, kh * kw, pitch]
            .into_iter()
            .try_fold(c_out.div_ceil(channels), usize::checked_mul)
            .is_some_and(|n| n < i32::MAX as usize);
        // Pixel indices within an image (and a block past its end) are 32-bit.
        let plane_fits = (oh * ow)
            .checked_add(WG_MAX_WARPS * WARP_PIXELS)
            .is_some_and(|n| n < i32::MAX as usize);
        (warps_fit && smem <= dev.info.max_shared_per_block && filter_fits && plane_fits).then_some(
            Plan {
                tiling,
                warpgroup,
                wide,
                cin_k,
                pitch,
                tps,
                warps,
                smem,
            },
        )
    }

    /// Output channels a block computes (a channel tile).
    pub(super) fn channels(&self) -> usize {
        if self.wide {
            64
        } else {
            32
        }
    }

    /// Whether the plan runs the warpgroup kernels.
    pub(super) fn warpgroup(&self) -> bool {
        self.warpgroup
    }

    /// Threads a block, and its dynamic shared memory in bytes.
    pub(super) fn threads(&self) -> usize {
        32 * self.warps
    }
    pub(super) fn smem(&self) -> usize {
        self.smem
    }

    /// Blocks along x (image × band, or pixel ranges) and y (channel tiles).
    pub(super) fn grid(&self, win: &Window2d, c_out: usize) -> (usize, usize) {
        let [oh, ow] = win.out_hw();
        let x = match self.tiling {
            Tiling::Bands(rows) => win.n * oh.div_ceil(rows),
            Tiling::Flat(warps) => (win.n * oh * ow).div_ceil(warps * WARP_PIXELS),
        };
        (x, c_out.div_ceil(self.channels()))
    }

    /// The kernel's `rows` argument: 0 for flat ranges.
    fn rows_arg(&self) -> i32 {
        match self.tiling {
            Tiling::Bands(rows) => rows as i32,
            Tiling::Flat(_) => 0,
        }
    }

    /// The convolution kernel of this plan for `dtype`.
    pub(super) fn kernel(&self, dtype: DType) -> &'static str {
        let names = match (self.warpgroup, self.wide) {
            (false, false) => &NARROW,
            (false, true) => &WIDE,
            (true, false) => &WG_NARROW,
            (true, true) => &WG_WIDE,
        };
        name_for(names, dtype)
    }

    /// Elements of one (tap, output channel) row of the prepared filter.
    pub(super) fn filter_row(&self) -> usize {
        if self.warpgroup {
            self.cin_k
        } else {
            self.pitch
        }
    }

    /// A relative cost: the pixel slots (warps × 32, plus the staged halo) the busiest SM
    /// works through, the blocks spread evenly.
    fn cost(&self, dev: &CudaDevice, win: &Window2d, c_out: usize) -> usize {
        let (x, y) = self.grid(win, c_out);
        let per_sm = (x * y).div_ceil(dev.info.multiprocessors);
        let halo = (win.kernel[0] - 1) * win.dilation[0] * win.out_hw()[1];
        per_sm * (self.warps * WARP_PIXELS + halo)
    }
}

/// Mirrors `conv_mma_row_pad` in conv_mma.cu: the 16-byte units the kernels stage after each
/// band row of `bw` pixels (`units` units each, odd), so that the eight pixels of an
/// ldmatrix that wrap from one output row into the next still hit distinct shared-memory
/// banks. On an H200 (b256 32→64 14² 5×5, `bench/tools/conv_wgmma`) the warpgroup kernel's
/// TF32 forward went 0.0316–0.0319 → 0.0309–0.0314 ms, bf16 0.0195–0.0196 → 0.0192–0.0194.
fn row_pad_units(bw: usize, ow: usize, stride: usize, units: usize) -> usize {
    let shift = ((ow * stride) as i64 - bw as i64) * units as i64;
    shift.rem_euclid(8) as usize
}

/// The most input rows a flat range of `pixels` output pixels stages: it touches at most
/// `t` output rows in `s` images, and stages `(rows − 1)·stride + span` input rows per
/// image, so `(t − s)·stride + s·span`, largest at s = 1 or at the most images.
fn flat_band_rows(win: &Window2d, pixels: usize) -> usize {
    let [oh, ow] = win.out_hw();
    let span = (win.kernel[0] - 1) * win.dilation[0] + 1;
    let t = (ow - 1 + pixels - 1) / ow + 1;
    let most = t.min((t - 1).div_ceil(oh) + 1);
    [1, most]
        .into_iter()
        .map(|s| (t - s) * win.stride[0] + s * span)
        .max()
        .unwrap_or(span)
}

/// Whether the kernels can compute this convolution.
pub(crate) fn applies(dev: &CudaDevice, dtype: DType, win: &Window2d, groups: usize) -> bool {
    let fits_i32 = |v: usize| v < i32::MAX as usize / 4;
    let precision = match dtype {
        DType::F16 | DType::BF16 => true,
        DType::F32 => super::tf32_enabled(),
        _ => false,
    };
    mode() != Mode::Never
        && precision
        && dev.info.compute_capability >= (8, 0)
        && groups == 1
        && win.c <= MAX_CHANNELS
        && [win.h, win.w, win.kernel[0] * win.kernel[1]]
            .into_iter()
            .chain(win.stride)
            .chain(win.padding)
            .chain(win.dilation)
            .all(fits_i32)
        && Plan::new(dev, dtype, win, 64, Tiling::Bands(1), false).is_some()
}

/// Up to three band heights, the cheapest by [`Plan::cost`] first, then the flat ranges
/// of 4 and 6 warps (measured beside them), then on sm_90 the warpgroup kernels' flat
/// ranges of 12, 8 and 4 warps.
fn candidates(dev: &CudaDevice, dtype: DType, win: &Window2d, c_out: usize) -> Vec<Plan> {
    let [oh, _] = win.out_hw();
    let mut plans: Vec<Plan> = (1..=oh)
        .map(|bands| oh.div_ceil(bands))
        .filter_map(|rows| Plan::new(dev, dtype, win, c_out, Tiling::Bands(rows), false))
        .collect();
    plans.dedup();
    plans.sort_by_key(|p| (p.cost(dev, win, c_out), usize::MAX - p.rows_arg() as usize));
    plans.truncate(3);
    let flat = |warps: usize, wg: bool| Plan::new(dev, dtype, win, c_out, Tiling::Flat(warps), wg);
    plans.extend([4, 6].into_iter().filter_map(|w| flat(w, false)));
    plans.extend([12, 8, 4].into_iter().filter_map(|w| flat(w, true)));
    let forced = *FORCED_TILING.lock().unwrap_or_else(|e| e.into_inner());
    plans.retain(|p| match forced {
        Some(ConvMmaTiling::Bands) => matches!(p.tiling, Tiling::Bands(_)),
        Some(ConvMmaTiling::Flat) => matches!(p.tiling, Tiling::Flat(_)) && !p.warpgroup,
        Some(ConvMmaTiling::Warpgroup) => p.warpgroup,
        None => true,
    });
    plans
}

/// Which of kiln's tensor-core convolution plans a test forces ([`force_conv_mma_tiling`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvMmaTiling {
    /// mma.sync over bands of one image's output rows.
    Bands,
    /// mma.sync over flat pixel ranges that may span images.
    Flat,
    /// Hopper's warpgroup MMA over flat ranges (sm_90 only: elsewhere no plan remains).
    Warpgroup,
}

/// The plans the tests force ([`force_conv_mma_tiling`]).
static FORCED_TILING: Mutex<Option<ConvMmaTiling>> = Mutex::new(None);

/// Restricts kiln's tensor-core convolution to one kind of plan, for tests that must run
/// each; `None` measures them all (the default). With [`ConvEngine::Kiln`] forced, the
/// first remaining candidate runs.
///
/// ```no_run
/// kiln::cuda::force_conv_mma_tiling(Some(kiln::cuda::ConvMmaTiling::Flat));
/// ```
#[doc(hidden)]
pub fn force_conv_mma_tiling(tiling: Option<ConvMmaTiling>) {
    *FORCED_TILING.lock().unwrap_or_else(|e| e.into_inner()) = tiling;
}

/// A measured problem: device, dtype, TF32, direction, window, output channels, the
/// strides of the operand read through a layout.
pub(super) type Key = (usize, DType, bool, Direction, Window2d, usize, [usize; 4]);

/// Measured choices of one of kiln's kernel families, by problem.
pub(super) type Choices<V> = OnceLock<Mutex<HashMap<Key, V>>>;

/// The key of problem (`x` at `l`, direction `d`, `win`, `c_out`) under the current TF32
/// setting.
pub(super) fn problem_key(
    x: &CudaStorage,
    l: &Layout,
    d: Direction,
    win: &Window2d,
    c_out: usize,
) -> Key {
    let s = l.strides();
    let strides = [s[0], s[1], s[2], s[3]];
    let tf32 = super::tf32_enabled();
    (x.dev().ordinal, x.dtype, tf32, d, *win, c_out, strides)
}

/// The choice an earlier process saved for `key` among `kind`'s (see `saved_choices.rs`):
/// the convolution families' choices are measured against cuDNN, so their files are per
/// cuDNN version. The device's ordinal is left out of the saved key.
pub(super) fn saved(kind: &str, dev: &CudaDevice, key: &Key) -> Option<String> {
    super::saved_choices::lookup(kind, dev, &super::cudnn::version_label(), &saved_key(key))
}

/// Saves `value` as `key`'s choice among `kind`'s, for later processes.
pub(super) fn save(kind: &str, dev: &CudaDevice, key: &Key, value: &str) {
    super::saved_choices::record(
        kind,
        dev,
        &super::cudnn::version_label(),
        &saved_key(key),
        value,
    );
}

fn saved_key(key: &Key) -> String {
    let (_ordinal, dtype, tf32, d, win, c_out, strides) = key;
    format!("{dtype:?} tf32={tf32} {d:?} {win:?} c_out={c_out} strides={strides:?}")
}

/// The choice remembered for `key`, if any.
pub(super) fn remembered<V: Copy>(choices: &Choices<V>, key: &Key) -> Option<V> {
    let map = choices.get_or_init(Default::default);
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(key)
        .copied()
}

/// Remembers `choice` for `key`.
pub(super) fn remember<V>(choices: &Choices<V>, key: Key, choice: V) {
    let map = choices.get_or_init(Default::default);
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, choice);
}

/// The plan to run this problem with, or `None` for the library. In `auto` mode the first
/// call of a problem times the candidate plans and the library (`library` returns `None`
/// when it has no way to) on the call's operands and remembers the fastest; inside a
/// CUDA-graph capture an unmeasured problem goes to the library.
pub(crate) fn choose(
    x: &CudaStorage,
    l: &Layout,
    d: Direction,
    win: &Window2d,
    c_out: usize,
    run: &mut dyn FnMut(&Plan) -> Result<CudaStorage>,
    library: &mut dyn FnMut() -> Result<Option<CudaStorage>>,
) -> Result<Option<Plan>> {
    static CHOICES: Choices<Option<Plan>> = OnceLock::new();
    let problem = Problem {
        x,
        l,
        d,
        win,
        c_out,
    };
    let plans = || candidates(x.dev(), x.dtype, win, c_out);
    choose_measured(&FAMILY, &CHOICES, mode(), &problem, plans, run, library)
}

/// One of kiln's kernel families that run where they measure faster than the library:
/// its name in logs and its saved choices' file (`saved_choices.rs`).
pub(super) struct Family {
    pub label: &'static str,
    pub saved_kind: &'static str,
    /// What runs where the family's kernels do not, in logs and saved choices.
    pub fallback: &'static str,
}

const FAMILY: Family = Family {
    label: "mma",
    saved_kind: "conv-mma",
    fallback: "cuDNN",
};

/// A plan of one of kiln's kernel families, as measured, logged and saved.
pub(super) trait Candidate: Copy + std::fmt::Debug {
    /// A short description for `KILN_CUDNN_LOG=1`.
    fn describe(&self) -> String;
}

impl Candidate for Plan {
    /// "14 rows", "flat 4 warps" or "flat 12 warps wgmma".
    fn describe(&self) -> String {
        let kind = if self.warpgroup { " wgmma" } else { "" };
        match self.tiling {
            Tiling::Bands(rows) => format!("{rows} rows{kind}"),
            Tiling::Flat(warps) => format!("flat {warps} warps{kind}"),
        }
    }
}

/// The convolution being decided: operand `x` at `l`, direction, window, output channels.
pub(super) struct Problem<'a> {
    pub x: &'a CudaStorage,
    pub l: &'a Layout,
    pub d: Direction,
    pub win: &'a Window2d,
    pub c_out: usize,
}

/// The plan among `plans()` (the first is the model's pick) to run `p` with, or `None` for
/// the library, by `mode`: `Always` the model's, `Never` none, `Auto` the fastest of the
/// plans and the library timed on the call's operands (once per problem, remembered in
/// `choices` and saved for later processes). Without cuDNN the family's kernels run
/// wherever they apply and the measurement only picks among their plans.
pub(super) fn choose_measured<P: Candidate>(
    family: &Family,
    choices: &Choices<Option<P>>,
    mode: Mode,
    p: &Problem<'_>,
    plans: impl Fn() -> Vec<P>,
    run: &mut dyn FnMut(&P) -> Result<CudaStorage>,
    library: &mut dyn FnMut() -> Result<Option<CudaStorage>>,
) -> Result<Option<P>> {
    let dev = p.x.dev();
    match mode {
        Mode::Never => return Ok(None),
        Mode::Always => return Ok(plans().first().copied()),
        Mode::Auto => {}
    }
    let with_library = super::cudnn::unavailable_reason().is_none();
    // A measured problem costs one lookup; its candidates are only made to measure them.
    let key = problem_key(p.x, p.l, p.d, p.win, p.c_out);
    if let Some(c) = remembered(choices, &key) {
        return Ok(c);
    }
    let plans = plans();
    if dev.capturing() || plans.is_empty() {
        // Nothing is timed inside a capture: cuDNN where it is there, else the model's plan.
        return Ok(if with_library {
            None
        } else {
            plans.first().copied()
        });
    }
    // An earlier process's choice, where it is still among the candidates. A process
    // without cuDNN neither reads nor writes them: its choices never weighed cuDNN.
    let saved = with_library
        .then(|| saved(family.saved_kind, dev, &key))
        .flatten()
        .and_then(|v| match v.as_str() {
            v if v == family.fallback => Some(None),
            v => plans
                .iter()
                .find(|p| format!("{p:?}") == v)
                .map(|p| Some(*p)),
        });
    if let Some(choice) = saved {
        remember(choices, key, choice);
        return Ok(choice);
    }
    let count = plans.len() + usize::from(with_library);
    let times = super::launch::time_candidates(dev, count, [2, 3], |i| match plans.get(i) {
        Some(plan) => run(plan).map(drop),
        None => match library()? {
            Some(_) => Ok(()),
            None => Err(crate::Error::Cuda("no library path".into())),
        },
    })?;
    let best = (0..times.len())
        .min_by(|&a, &b| times[a].total_cmp(&times[b]))
        .unwrap_or(plans.len());
    let choice = plans.get(best).copied();
    if std::env::var("KILN_CUDNN_LOG").is_ok_and(|v| v == "1") {
        let shown: Vec<String> = plans
            .iter()
            .zip(&times)
            .map(|(plan, t)| format!("{} {:.4} ms", plan.describe(), t / 3.0))
            .collect();
        let (label, fallback) = (family.label, family.fallback);
        let library_time = match times.get(plans.len()) {
            Some(t) => format!("{fallback} {:.4} ms per call", t / 3.0),
            None => "no cuDNN".to_string(),
        };
        eprintln!(
            "kiln conv2d {:?} {:?} {} -> {} (tf32 {}): {label} {}, {library_time} -> {}",
            p.d,
            p.l.dims(),
            p.x.dtype,
            p.c_out,
            key.2,
            shown.join(", "),
            choice.map_or(fallback.to_string(), |c| format!(
                "{label} {}",
                c.describe()
            )),
        );
    }
    if with_library {
        let text = choice.map_or(family.fallback.to_string(), |c| format!("{c:?}"));
        save(family.saved_kind, dev, &key, &text);
    }
    remember(choices, key, choice);
    Ok(choice)
}

/// Lets `name` (of `source`) take the dynamic shared memory the device allows (once per
/// device).
pub(super) fn allow_shared_memory(
    dev: &CudaDevice,
    source: super::compile::KernelSource,
    name: &'static str,
) -> Result<()> {
    static DONE: OnceLock<Mutex<HashSet<(usize, &'static str)>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    if done
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(dev.ordinal, name))
    {
        return Ok(());
    }
    let f = dev.function(source, name)?;
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        dev.info.max_shared_per_block as i32,
    )
    .map_err(launch_err(name))?;
    done.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((dev.ordinal, name));
    Ok(())
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many convolutions (forward or input gradient) kiln's tensor-core kernel has computed
/// in this process, timing runs included: for tests and measurements that need to know
/// which path ran.
pub fn conv_mma_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// What the kernel does after the convolution: add a bias (`[c_out]` at its layout), then
/// optionally the ReLU.
pub(crate) type Epilogue<'a> = super::conv_direct::Epilogue<'a>;

/// `y = conv(x, w)` (then `epilogue`), packed `[n, c_out, oh, ow]`, for `x` at `l` (any
/// strides) and the filter `w` at `wl` (`[c_out, c, kh, kw]`; with `flip`, the
/// `[c, c_out, kh, kw]` filter to transpose and mirror). The caller has checked [`applies`]
/// and made `plan` for this problem.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    x: &CudaStorage,
    l: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    win: &Window2d,
    c_out: usize,
    flip: bool,
    epilogue: Epilogue<'_>,
    plan: &Plan,
) -> Result<CudaStorage> {
    let dev = x.dev();
    let [oh, ow] = win.out_hw();
    let name = plan.kernel(x.dtype);
    allow_shared_memory(dev, super::compile::KernelSource::ConvMma, name)?;
    let (gx, gy) = plan.grid(win, c_out);
    let filter = super::conv_mma_filter::filter(w, wl, plan, win, c_out, flip)?;
    let y = CudaStorage::alloc(dev, win.n * c_out * oh * ow, x.dtype)?;
    let (_b_copy, bias_ptr, relu) = super::conv_direct::epilogue_args(epilogue)?;
    let cfg = LaunchConfig {
        grid_dim: (gx as u32, gy as u32, 1),
        block_dim: (plan.threads() as u32, 1, 1),
        shared_mem_bytes: plan.smem as u32,
    };
    let args = WindowArgs::new(win, l);
    // SAFETY: `x` holds every element its layout indexes (layout invariant); the prepared
    // filter has room for `plan` (whole channel tiles of `taps × row`, 16-byte aligned
    // rows), and is complete or, with `meet` set, prepared by the launch from the packed
    // filter `raw` (c_out·cin·taps elements; `meet` the device's two counters, zero between
    // launches on its one stream; every block resident at once, or waiting `wait_ns` at
    // most); `bias_ptr` null or `c_out` packed elements (the caller checked the bias shape);
    // `y` `n·c_out·oh·ow` elements. The block has `plan.warps` warps (≤ the kernel's launch
    // bound: 8, or 12 in whole warpgroups for `conv_wg*`, which `Plan::new` gives only on
    // sm_90, where the module is compiled for sm_90a) and the dynamic shared memory the plan
    // sized (within the opt-in set above); the arguments match `conv_{mma,wg}{32,64}_<T>`'s
    // (x, wp, y, Win, c_out, bias, relu, rows, cin_k, pitch, tps, w_raw, flip, meet,
    // wait_ns).
    unsafe {
        dev.call(
            super::compile::KernelSource::ConvMma,
            name,
            cfg,
            &mut [
                &mut { x.buf.ptr },
                &mut { filter.prepared.buf.ptr },
                &mut { y.buf.ptr },
                &mut { args },
                &mut { c_out as u64 },
                &mut { bias_ptr },
                &mut { relu },
                &mut { plan.rows_arg() },
                &mut { plan.cin_k as i32 },
                &mut { plan.pitch as i32 },
                &mut { plan.tps as i32 },
                &mut { filter.raw },
                &mut { i32::from(flip) },
                &mut { filter.meet },
                &mut { filter.wait_ns },
            ],
        )
    }?;
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::row_pad_units;

    /// The eight ldmatrix rows of consecutive pixels (`stride·units` 16-byte units apart)
    /// land on distinct bank groups (mod 8) also when they wrap into the next output row.
    #[test]
    fn padded_band_rows_keep_ldmatrix_rows_on_distinct_banks() {
        for units in [1, 3, 5, 9, 17] {
            for ow in 1..40 {
                for stride in [1, 3] {
                    for (kw, dilation) in [(1, 1), (3, 1), (5, 1), (3, 2)] {
                        let bw = (ow - 1) * stride + (kw - 1) * dilation + 1;
                        let row = bw * units + row_pad_units(bw, ow, stride, units);
                        for first in 0..ow {
                            let banks: std::collections::HashSet<usize> = (first..first + 8)
                                .map(|p| ((p / ow) * row + (p % ow) * stride * units) % 8)
                                .collect();
                            assert_eq!(
                                banks.len(),
                                8,
                                "units {units} ow {ow} stride {stride} kw {kw} first {first}"
                            );
                        }
                    }
                }
            }
        }
    }
}
