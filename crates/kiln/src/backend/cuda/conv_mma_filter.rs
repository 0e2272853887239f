//! The filter as kiln's tensor-core convolution kernels read it (`conv_mma.rs`): rearranged
//! per tap and channel tile, zero-padded, TF32-rounded for f32. Either a kernel of its own
//! prepares it before the convolution (`conv_mma_weights_*`), or the convolution's own
//! blocks do, each a slice, meeting once before their first weights load (`load_slice` …
//! `await_slices` in `kernels/conv_mma.cu`).
//!
//! Fusing saves the preparing kernel's launch. Timed from an idle device as kiln's bench
//! times a call (H100, `bench/tools/conv_wgmma`, b256 32→64 14² 5×5 forward, 12 warps of
//! warpgroup MMA, 19 processes): 0.0398–0.0440 ms with the preparation separate,
//! 0.0384–0.0425 fused, 0.0358–0.0385 with no preparation at all; bf16 0.0271–0.0308 →
//! 0.0251–0.0276 (`bench/results/2026-11-28d-h100-conv-fused-prep`).
//!
//! The meeting is safe only if every block of the grid can be resident at once, so the
//! preparation is fused only then (by the occupancy the driver reports), and only when a
//! block's slice is small ([`SLICE_PER_THREAD`] elements a thread): with few blocks, each
//! would prepare so much that the separate kernel is faster (a 13→100 11×9 problem of 2
//! blocks: 0.0158 against 0.0241 ms fused). A block that still waits longer than
//! [`WAIT_NS`] (other work on the GPU holding SMs) prepares the whole filter itself.

use super::conv_mma::Plan;
use super::launch::{kernel_names, launch_err, name_for};
use super::CudaStorage;
use crate::layout::Layout;
use crate::op::Window2d;
use crate::Result;
use cudarc::driver::LaunchConfig;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

const WEIGHTS: [&str; 7] = kernel_names!("conv_mma_weights");
/// Mirrors `CONV_MMA_PREP_BYTES` in conv_mma.cu: the filter-preparing kernel's shared buffer.
const PREP_BYTES: usize = 8192;
/// Mirrors `SLICE_PER_THREAD` in conv_mma.cu: the elements of its slice a thread of a
/// fused preparation holds in registers while staging.
const SLICE_PER_THREAD: usize = 2;
/// How long a block of a fused preparation waits for the others' slices before it prepares
/// the whole filter itself (the blocks of a resident grid meet within a few µs).
const WAIT_NS: u64 = 200_000;

/// How kiln's tensor-core convolution prepares its filter ([`set_conv_mma_filter_prep`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvMmaFilterPrep {
    /// In the convolution's own launch where the grid is resident at once and slices are
    /// small, else by a kernel of its own (the default).
    Fused,
    /// Always by a kernel of its own.
    Separate,
    /// In the convolution's launch wherever the grid is resident at once, whatever the
    /// slices' size.
    FusedAlways,
    /// As `FusedAlways`, with every block preparing the whole filter instead of meeting the
    /// others (the kernel's way out when its grid is not all resident).
    FusedEveryBlock,
}

/// The [`ConvMmaFilterPrep`] in force, as its index in [`PREPS`].
static FILTER_PREP: AtomicU8 = AtomicU8::new(0);
const PREPS: [ConvMmaFilterPrep; 4] = [
    ConvMmaFilterPrep::Fused,
    ConvMmaFilterPrep::Separate,
    ConvMmaFilterPrep::FusedAlways,
    ConvMmaFilterPrep::FusedEveryBlock,
];
static FUSED_LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Sets how later convolutions by kiln's tensor-core kernels prepare their filter, for
/// tests and measurements that must run each way.
///
/// ```no_run
/// kiln::cuda::set_conv_mma_filter_prep(kiln::cuda::ConvMmaFilterPrep::Separate);
/// ```
#[doc(hidden)]
pub fn set_conv_mma_filter_prep(prep: ConvMmaFilterPrep) {
    let code = PREPS.iter().position(|&p| p == prep).unwrap_or(0);
    FILTER_PREP.store(code as u8, Ordering::Relaxed);
}

/// How many of kiln's tensor-core convolutions prepared their filter in their own launch.
#[doc(hidden)]
pub fn conv_mma_fused_launches() -> u64 {
    FUSED_LAUNCHES.load(Ordering::Relaxed)
}

/// The filter a convolution launch reads, and what the kernel's fused preparation needs:
/// the packed filter, and the meeting counters (0: `prepared` is complete already).
pub(super) struct Filter {
    pub prepared: CudaStorage,
    /// A packed copy of a strided filter, kept alive while the kernel reads it.
    _packed: Option<CudaStorage>,
    pub raw: u64,
    pub meet: u64,
    pub wait_ns: u64,
}

/// The filter `w` at `wl` (`[c_out, cin, taps]` packed, or with `flip` the `[cin, c_out,
/// taps]` filter to transpose and mirror) for `plan`'s launch on `win`, as `[tap][co][row]`
/// (`row` elements: the staged row length, or for the warpgroup kernels the 16-byte chunks
/// of `[tap][chunk][co][16 bytes]`) over whole channel tiles: prepared here, or left for the
/// launch to prepare.
pub(super) fn filter(
    w: &CudaStorage,
    wl: &Layout,
    plan: &Plan,
    win: &Window2d,
    c_out: usize,
    flip: bool,
) -> Result<Filter> {
    let dev = w.dev();
    let (packed, raw) = super::conv_direct::packed(w, wl)?;
    let (cin, taps, row, chunked) = (
        win.c,
        win.kernel[0] * win.kernel[1],
        plan.filter_row(),
        plan.warpgroup(),
    );
    let co_pad = c_out.div_ceil(plan.channels()) * plan.channels();
    let total = co_pad * taps * row;
    let prepared = CudaStorage::alloc(dev, total, w.dtype)?;
    let prep = PREPS[usize::from(FILTER_PREP.load(Ordering::Relaxed)) % PREPS.len()];
    let (gx, gy) = plan.grid(win, c_out);
    let blocks = gx * gy;
    let small_slices = total.div_ceil(blocks.max(1)) <= SLICE_PER_THREAD * plan.threads();
    let wanted = match prep {
        ConvMmaFilterPrep::Fused => small_slices,
        ConvMmaFilterPrep::Separate => false,
        ConvMmaFilterPrep::FusedAlways | ConvMmaFilterPrep::FusedEveryBlock => true,
    };
    let fused = wanted
        && blocks <= resident_blocks(dev, plan.kernel(w.dtype), plan.threads(), plan.smem())?;
    let mut filter = Filter {
        prepared,
        _packed: packed,
        raw,
        meet: 0,
        wait_ns: 0,
    };
    if fused {
        filter.meet = dev.grid_meet;
        filter.wait_ns = match prep {
            ConvMmaFilterPrep::FusedEveryBlock => 0,
            _ => WAIT_NS,
        };
        FUSED_LAUNCHES.fetch_add(1, Ordering::Relaxed);
        return Ok(filter);
    }
    // One block per output channel (padded ones write zeros), `chunk` taps of its filter
    // through the kernel's shared buffer at a time.
    let chunk = (PREP_BYTES / w.dtype.size_in_bytes() / cin.max(1)).clamp(1, taps.max(1));
    let cfg = LaunchConfig {
        grid_dim: (co_pad as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `raw` holds the packed filter (c_out·cin·taps elements), `prepared` `total`
    // elements of the dtype's size (TF32 bits for f32), `taps·co_pad` rows of `row`
    // (fewer than 2^31 elements, `Plan::new`; for the chunked layout a multiple of 16
    // bytes); `chunk·cin` staged elements fit the kernel's CONV_MMA_PREP_BYTES (cin ≤
    // MAX_CHANNELS, so chunk ≥ 1 fits); the arguments match `conv_mma_weights_<T>`'s (w, wp,
    // c_out, cin, taps, row, co_pad, flip, chunk, chunked).
    unsafe {
        dev.call(
            super::compile::KernelSource::ConvMma,
            name_for(&WEIGHTS, w.dtype),
            cfg,
            &mut [
                &mut { raw },
                &mut { filter.prepared.buf.ptr },
                &mut { c_out as u64 },
                &mut { cin as u64 },
                &mut { taps as u64 },
                &mut { row as u64 },
                &mut { co_pad as u64 },
                &mut { i32::from(flip) },
                &mut { chunk as u32 },
                &mut { i32::from(chunked) },
            ],
        )
    }?;
    Ok(filter)
}

/// The blocks of kernel `name` (`threads` a block, `smem` bytes of dynamic shared memory)
/// the whole device holds at once, by the driver's occupancy (once per kernel and shape).
pub(super) fn resident_blocks(
    dev: &super::CudaDevice,
    name: &'static str,
    threads: usize,
    smem: usize,
) -> Result<usize> {
    type Shapes = HashMap<(usize, &'static str, usize, usize), usize>;
    static RESIDENT: OnceLock<Mutex<Shapes>> = OnceLock::new();
    let key = (dev.ordinal, name, threads, smem);
    let cache = RESIDENT.get_or_init(Default::default);
    if let Some(&n) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(n);
    }
    let f = dev.function(super::compile::KernelSource::ConvMma, name)?;
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(threads as u32, smem, None)
        .map_err(launch_err(name))?;
    let n = per_sm as usize * dev.info.multiprocessors;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, n);
    Ok(n)
}
