//! kiln's own direct convolution (kernels `conv_direct*` in `kernels/window.cu`) for problems
//! with few taps per output channel (`c_in·kh·kw ≤ 64`, one group: the first layer of an image
//! network). cuDNN's implicit GEMMs reach only 3–5 TFLOP/s there (b256 1→32 5×5 on the H100),
//! because a 25-deep reduction leaves their tensor-core tiles idle; a thread per output pixel
//! with the filter in shared memory is bound by writing the output instead.
//!
//! Which path runs is chosen per problem by measurement (`KILN_CONV_DIRECT=auto`, the
//! default): the forward and the weight gradient are each timed once against cuDNN on the
//! call's own operands and the faster is kept. `=1` forces the direct kernels wherever they
//! apply (the GPU tests run that way too), `=0` never uses them; `kiln::cuda::set_conv_engine`
//! overrides it. Without cuDNN the direct
//! forward runs wherever it applies (instead of im2col + GEMM), the weight gradient does not.
//!
//! Measured on the H100 (2026-11-25, per call): the forward 0.029 ms against cuDNN's 0.033
//! for b256 1→32 28² 5×5 and 0.019 against 0.020–0.026 for b1 3→64 224² 3×3, so it runs
//! there, with the bias and ReLU in its store (`conv2d_bias_act`). The weight gradient of a
//! stride-1 filter 3, 5 or 7 wide stages whole rows (`conv_wgrad_rows`, [`RowsPlan`]):
//! 0.027 ms against cuDNN's 0.054 for b256 1→32 with TF32 (2026-11-26; the im2col-staged
//! kernel, which other shapes keep, took 0.070).

use super::conv_mma::{problem_key, remember, remembered, Choices, Mode};
use super::cudnn::Direction;
use super::launch::{grid_1d, kernel_names, name_for, BLOCK};
use super::window::WindowArgs;
use super::{CudaDevice, CudaStorage};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;
use std::sync::OnceLock;

/// Taps per output channel (`c_in·kh·kw`) the kernels hold in shared memory; mirrors
/// `DIRECT_TAPS` in window.cu.
const MAX_TAPS: usize = 64;
/// Output channels per block of the forward kernel; mirrors `DIRECT_CO` (the `wide` kernel
/// takes twice as many).
const CHANNELS_PER_BLOCK: usize = 16;
/// Output channels per block of the weight-gradient kernel; mirrors `WGRAD_CO`.
const WGRAD_CHANNELS: usize = 32;
/// Pixels staged per step of the weight-gradient kernel; mirrors `WGRAD_P`.
const WGRAD_PIXELS: usize = 32;

const FORWARD: [&str; 7] = kernel_names!("conv_direct");
const FORWARD_WIDE: [&str; 7] = kernel_names!("conv_direct_wide");
const WGRAD: [&str; 7] = kernel_names!("conv_direct_wgrad");
const WGRAD_SUM: [&str; 7] = kernel_names!("conv_direct_wgrad_sum");
const WGRAD_ROWS3: [&str; 7] = kernel_names!("conv_wgrad_rows3");
const WGRAD_ROWS5: [&str; 7] = kernel_names!("conv_wgrad_rows5");
const WGRAD_ROWS7: [&str; 7] = kernel_names!("conv_wgrad_rows7");
/// Shared memory the row-staged weight gradient may use without opting in, in bytes.
const ROWS_STAGE_BYTES: usize = 48 * 1024;

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    super::conv_mma::mode_of("KILN_CONV_DIRECT", &MODE)
}

/// Whether the direct kernels compute this convolution.
pub(crate) fn applies(dtype: DType, win: &Window2d, groups: usize) -> bool {
    let fits_i32 = |v: usize| v < i32::MAX as usize / 4;
    let [oh, ow] = win.out_hw();
    mode() != Mode::Never
        && groups == 1
        && dtype.is_float()
        && win.c * win.kernel[0] * win.kernel[1] <= MAX_TAPS
        && [win.h, win.w, oh * ow].into_iter().all(fits_i32)
        && [win.stride, win.padding, win.dilation]
            .iter()
            .flatten()
            .all(|&v| fits_i32(v))
}

/// Whether the direct kernel should compute this problem rather than the library (`library`
/// returns `None` when it has no way to). In `auto` mode the first call of a problem times
/// both on the call's operands (each run once to warm up, then 2 rounds of 3) and remembers
/// the faster; inside a CUDA-graph capture an unmeasured problem goes to the library, which
/// then says why it cannot be recorded.
pub(crate) fn prefer_direct(
    x: &CudaStorage,
    l: &Layout,
    d: Direction,
    win: &Window2d,
    c_out: usize,
    direct: &mut dyn FnMut() -> Result<CudaStorage>,
    library: &mut dyn FnMut() -> Result<Option<CudaStorage>>,
) -> Result<bool> {
    match mode() {
        Mode::Always => return Ok(true),
        Mode::Never => return Ok(false),
        // Without cuDNN the alternative is im2col + GEMM. The direct forward reads each
        // input once where im2col writes it c·kh·kw times; the direct weight gradient was
        // only measured against cuDNN (0.8–1.3× its time on the H100), not against im2col +
        // GEMM, so it is not preferred unmeasured.
        Mode::Auto if super::cudnn::unavailable_reason().is_some() => {
            return Ok(d == Direction::Forward)
        }
        Mode::Auto => {}
    }
    static CHOICES: Choices<bool> = OnceLock::new();
    let key = problem_key(x, l, d, win, c_out);
    if let Some(c) = remembered(&CHOICES, &key) {
        return Ok(c);
    }
    if x.dev().capturing() {
        return Ok(false);
    }
    let saved = super::conv_mma::saved("conv-direct", x.dev(), &key);
    let saved = saved.and_then(|v| match v.as_str() {
        "direct" => Some(true),
        "cuDNN" => Some(false),
        _ => None,
    });
    if let Some(wins) = saved {
        remember(&CHOICES, key, wins);
        return Ok(wins);
    }
    let times = super::launch::time_candidates(x.dev(), 2, [2, 3], |i| match i {
        0 => direct().map(drop),
        _ => match library()? {
            Some(_) => Ok(()),
            None => Err(crate::Error::Cuda("no library path".into())),
        },
    })?;
    let wins = times[0] <= times[1];
    if std::env::var("KILN_CUDNN_LOG").is_ok_and(|v| v == "1") {
        eprintln!(
            "kiln conv2d {d:?} {:?} {} -> {c_out} (tf32 {}): direct {:.4} ms, cuDNN {:.4} ms per call -> {}",
            l.dims(),
            x.dtype,
            key.2,
            times[0] / 3.0,
            times[1] / 3.0,
            if wins { "direct" } else { "cuDNN" }
        );
    }
    let text = if wins { "direct" } else { "cuDNN" };
    super::conv_mma::save("conv-direct", x.dev(), &key, text);
    remember(&CHOICES, key, wins);
    Ok(wins)
}

/// A 2-D launch: `blocks` along x, one block per `channels` output channels along y.
fn grid(blocks: usize, c_out: usize, channels: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            blocks.clamp(1, 65_535) as u32,
            c_out.div_ceil(channels) as u32,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A packed copy of `s` at `l` unless it already is packed; returns the pointer to use.
pub(super) fn packed(s: &CudaStorage, l: &Layout) -> Result<(Option<CudaStorage>, u64)> {
    if l.is_contiguous() {
        Ok((None, s.ptr_at(l.offset())))
    } else {
        let c = super::elementwise::cast(s, l, s.dtype)?;
        let p = c.buf.ptr;
        Ok((Some(c), p))
    }
}

/// What the forward kernel does after the convolution: add a bias (`[c_out]` at its layout),
/// then optionally the ReLU.
pub(crate) type Epilogue<'a> = Option<(&'a CudaStorage, &'a Layout, bool)>;

/// The kernel arguments of `epilogue`: the packed bias's pointer (null without one; the
/// first field keeps a packed copy alive where its layout was not packed) and the ReLU flag.
pub(super) fn epilogue_args(epilogue: Epilogue<'_>) -> Result<(Option<CudaStorage>, u64, i32)> {
    match epilogue {
        Some((b, bl, relu)) => {
            let (copy, ptr) = packed(b, bl)?;
            Ok((copy, ptr, i32::from(relu)))
        }
        None => Ok((None, 0, 0)),
    }
}

/// `y = conv(x, w)` (then `epilogue`), packed `[n, c_out, oh, ow]`, for `x` at `l` (any
/// strides) and the filter `w` at `wl` (`[c_out, c, kh, kw]`). The caller has checked
/// [`applies`].
pub(crate) fn forward(
    x: &CudaStorage,
    l: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    win: &Window2d,
    epilogue: Epilogue<'_>,
) -> Result<CudaStorage> {
    let c_out = wl.dims()[0];
    let [oh, ow] = win.out_hw();
    let pixels = win.n * oh * ow;
    let y = CudaStorage::alloc(x.dev(), pixels * c_out, x.dtype)?;
    let (_w_copy, w_ptr) = packed(w, wl)?;
    let (_b_copy, bias_ptr, relu) = epilogue_args(epilogue)?;
    let args = WindowArgs::new(win, l);
    let cap = x.dev().info.multiprocessors * 16;
    let blocks = pixels.div_ceil(BLOCK as usize).min(cap);
    // Twice the channels a thread where that pads no more channels than the narrow kernel
    // does (32, 64, 20 output channels; not 48): the per-tap addressing and loads of x then
    // serve twice the multiply-adds.
    let wide_channels = 2 * CHANNELS_PER_BLOCK;
    let wide = c_out.div_ceil(wide_channels) * wide_channels
        == c_out.div_ceil(CHANNELS_PER_BLOCK) * CHANNELS_PER_BLOCK;
    let (table, per_block) = if wide {
        (&FORWARD_WIDE, wide_channels)
    } else {
        (&FORWARD, CHANNELS_PER_BLOCK)
    };
    // SAFETY: `x` holds every element its layout indexes (layout invariant), `w_ptr` the
    // packed `c_out × c·kh·kw` filter (≤ MAX_TAPS taps, checked by `applies`), `bias_ptr`
    // null or `c_out` packed elements (the caller checked the bias shape), `y` `pixels ×
    // c_out` elements; the arguments match `conv_direct_<T>`'s and `conv_direct_wide_<T>`'s
    // (x, w, y, Win, c_out, bias, relu).
    unsafe {
        x.dev().call(
            super::compile::KernelSource::Window,
            name_for(table, x.dtype),
            grid(blocks, c_out, per_block),
            &mut [
                &mut { x.buf.ptr },
                &mut { w_ptr },
                &mut { y.buf.ptr },
                &mut { args },
                &mut { c_out as u64 },
                &mut { bias_ptr },
                &mut { relu },
            ],
        )
    }?;
    Ok(y)
}

/// The weight gradient `[c_out, c, kh, kw]` (packed) from the input `x` at `l` and the output
/// gradient `dy` at `dyl`: per-block partial sums over pixel chunks, then their ordered sum
/// (deterministic). The caller has checked [`applies`].
pub(crate) fn weight_grad(
    x: &CudaStorage,
    l: &Layout,
    dy: &CudaStorage,
    dyl: &Layout,
    win: &Window2d,
    c_out: usize,
) -> Result<CudaStorage> {
    let dev: &std::sync::Arc<CudaDevice> = x.dev();
    let [oh, ow] = win.out_hw();
    let pixels = win.n * oh * ow;
    let taps = win.c * win.kernel[0] * win.kernel[1];
    let (_dy_copy, dy_ptr) = packed(dy, dyl)?;
    if let Some(plan) = RowsPlan::new(dev, x.dtype, win, c_out, dy_ptr) {
        return plan.run(x, l, dy_ptr, win, c_out);
    }
    // About four blocks per SM in all, each summing a whole number of staging steps.
    let channel_blocks = c_out.div_ceil(WGRAD_CHANNELS);
    let target = (dev.info.multiprocessors * 4 / channel_blocks).max(1);
    let steps = pixels.div_ceil(WGRAD_PIXELS);
    let chunk = steps.div_ceil(target).max(1) * WGRAD_PIXELS;
    let blocks = pixels.div_ceil(chunk).max(1);
    let acc = if x.dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let partial = CudaStorage::alloc(dev, blocks * c_out * taps, acc)?;
    let args = WindowArgs::new(win, l);
    // SAFETY: as in `forward`; `dy_ptr` holds the packed `[n, c_out, oh, ow]` gradient and
    // `partial` `blocks × c_out × taps` elements of the accumulation type the kernel writes;
    // the arguments match `conv_direct_wgrad_<T>`'s (x, dy, partial, Win, c_out, chunk).
    unsafe {
        dev.call(
            super::compile::KernelSource::Window,
            name_for(&WGRAD, x.dtype),
            grid(blocks, c_out, WGRAD_CHANNELS),
            &mut [
                &mut { x.buf.ptr },
                &mut { dy_ptr },
                &mut { partial.buf.ptr },
                &mut { args },
                &mut { c_out as u64 },
                &mut { chunk as u64 },
            ],
        )
    }?;
    sum_partials(&partial, blocks, c_out * taps, x.dtype)
}

/// `dw` (`total` elements of `dtype`) from the partial sums (`[total][blocks]`, f32 or f64)
/// of the weight-gradient kernels, added in a fixed order.
fn sum_partials(
    partial: &CudaStorage,
    blocks: usize,
    total: usize,
    dtype: DType,
) -> Result<CudaStorage> {
    let dev = partial.dev();
    let dw = CudaStorage::alloc(dev, total, dtype)?;
    // SAFETY: `partial` holds `total` rows of `blocks` sums, `dw` `total` elements; the
    // arguments match `conv_direct_wgrad_sum_<T>`'s (partial, dw, total, parts).
    unsafe {
        dev.call(
            super::compile::KernelSource::Window,
            name_for(&WGRAD_SUM, dtype),
            grid_1d(dev, total as u64 * 32), // a warp per element
            &mut [
                &mut { partial.buf.ptr },
                &mut { dw.buf.ptr },
                &mut { total as u64 },
                &mut { blocks as u64 },
            ],
        )
    }?;
    Ok(dw)
}

/// The launch of `conv_wgrad_rows<KW>` for a weight gradient it handles: stride 1 and
/// dilation 1, a filter row of 3, 5 or 7 taps, at most 32 (input channel, filter row) pairs
/// (a warp each), f32/f16/bf16, and a stage of at least one output row within
/// [`ROWS_STAGE_BYTES`].
struct RowsPlan {
    kernel: &'static str,
    /// Output rows staged per step.
    rows: usize,
    /// `ow` rounded up to 4; floats per staged x row; floats per channel of the dy stage.
    owp: usize,
    xw: usize,
    pitch: usize,
    /// Whether dy is read 16 (f32) or 8 (16-bit) bytes at a time.
    vec: bool,
    grid: (usize, usize),
    warps: usize,
}

impl RowsPlan {
    fn new(
        dev: &CudaDevice,
        dtype: DType,
        win: &Window2d,
        c_out: usize,
        dy_ptr: u64,
    ) -> Option<RowsPlan> {
        // `KILN_CONV_WGRAD_ROWS=0` keeps the im2col-staged kernel (for A/B measurements).
        static ENABLED: OnceLock<bool> = OnceLock::new();
        if !*ENABLED.get_or_init(|| std::env::var("KILN_CONV_WGRAD_ROWS").as_deref() != Ok("0")) {
            return None;
        }
        let [kh, kw] = win.kernel;
        let kernel = match (kw, dtype) {
            (_, DType::F64) => return None,
            (3, _) => name_for(&WGRAD_ROWS3, dtype),
            (5, _) => name_for(&WGRAD_ROWS5, dtype),
            (7, _) => name_for(&WGRAD_ROWS7, dtype),
            _ => return None,
        };
        let warps = win.c * kh;
        if win.stride != [1, 1] || win.dilation != [1, 1] || warps > 32 {
            return None;
        }
        let [oh, ow] = win.out_hw();
        let owp = ow.div_ceil(4) * 4;
        let xw = owp - 4 + 4 * (kw + 3).div_ceil(4);
        // ≥ rows·owp and ≡ 4 (mod 8): eight consecutive lanes' 16-byte loads hit distinct banks.
        let pitch = |rows: usize| match rows * owp {
            n if n % 8 == 4 => n,
            n => n + 4, // owp is a multiple of 4
        };
        let floats = |rows: usize| 32 * pitch(rows) + win.c * (rows + kh - 1) * xw;
        let fit = (1..=oh)
            .take_while(|&r| floats(r) * 4 <= ROWS_STAGE_BYTES)
            .last()?;
        // Enough units (image, band) for two blocks per SM where the batch is small, in
        // bands of even height.
        let channel_groups = c_out.div_ceil(32);
        let sms = dev.info.multiprocessors;
        let want_bands = (2 * sms).div_ceil(win.n * channel_groups).max(1);
        let bands = oh.div_ceil(fit).max(want_bands.min(oh));
        let rows = oh.div_ceil(bands);
        let units = win.n * oh.div_ceil(rows);
        // At most four blocks per SM, each walking an equal number of units.
        let cap = (4 * sms / channel_groups).max(1);
        let per_block = units.div_ceil(cap);
        let elem = dtype.size_in_bytes();
        let vec = ow.is_multiple_of(4) && dy_ptr.is_multiple_of(4 * elem as u64);
        Some(RowsPlan {
            kernel,
            rows,
            owp,
            xw,
            pitch: pitch(rows),
            vec,
            grid: (units.div_ceil(per_block), channel_groups),
            warps,
        })
    }

    fn run(
        &self,
        x: &CudaStorage,
        l: &Layout,
        dy_ptr: u64,
        win: &Window2d,
        c_out: usize,
    ) -> Result<CudaStorage> {
        let dev = x.dev();
        let taps = win.c * win.kernel[0] * win.kernel[1];
        let blocks = self.grid.0;
        let partial = CudaStorage::alloc(dev, blocks * c_out * taps, DType::F32)?;
        let floats = 32 * self.pitch + win.c * (self.rows + win.kernel[0] - 1) * self.xw;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, self.grid.1 as u32, 1),
            block_dim: (32 * self.warps as u32, 1, 1),
            shared_mem_bytes: (floats * 4) as u32,
        };
        let args = WindowArgs::new(win, l);
        // SAFETY: `x` holds every element its layout indexes (layout invariant), `dy_ptr` the
        // packed `[n, c_out, oh, ow]` gradient (aligned for its vector loads when `vec`),
        // `partial` `blocks × c_out × taps` f32; the block has a warp per (input channel,
        // filter row) and the dynamic shared memory the kernel's stage takes (`floats`); the
        // arguments match `conv_wgrad_rows<KW>_<T>`'s (x, dy, partial, Win, c_out, rows, owp,
        // xw, pitch, vec).
        unsafe {
            dev.call(
                super::compile::KernelSource::Window,
                self.kernel,
                cfg,
                &mut [
                    &mut { x.buf.ptr },
                    &mut { dy_ptr },
                    &mut { partial.buf.ptr },
                    &mut { args },
                    &mut { c_out as u64 },
                    &mut { self.rows as i32 },
                    &mut { self.owp as i32 },
                    &mut { self.xw as i32 },
                    &mut { self.pitch as i32 },
                    &mut { i32::from(self.vec) },
                ],
            )
        }?;
        sum_partials(&partial, blocks, c_out * taps, x.dtype)
    }
}
