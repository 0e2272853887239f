//! Kernel arguments and launch geometry shared by the CUDA ops.

use super::device::CudaDevice;
use crate::layout::{merge_dims, Layout};
use crate::{DType, Error, Result};
use cudarc::driver::{DeviceRepr, LaunchConfig};

/// Mirrors `Strided<K>` in `common.cuh`: merged dims and each operand's strides.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct StridedArgs<const K: usize> {
    rank: u32,
    dims: [u64; 8],
    strides: [[u64; 8]; K],
}

// SAFETY: a plain #[repr(C)] struct of integers, laid out as the C struct it mirrors.
unsafe impl<const K: usize> DeviceRepr for StridedArgs<K> {}

impl<const K: usize> StridedArgs<K> {
    pub fn zeroed() -> Self {
        StridedArgs {
            rank: 0,
            dims: [0; 8],
            strides: [[0; 8]; K],
        }
    }

    pub fn new(rank: u32, dims: [u64; 8], strides: [[u64; 8]; K]) -> Self {
        StridedArgs {
            rank,
            dims,
            strides,
        }
    }
}

/// Element-wise launch plan over `K` operands of one shape (operand 0 is the output).
pub(crate) struct ElementwisePlan<const K: usize> {
    pub n: u64,
    /// 0: contiguous and 16-byte aligned, 1: contiguous, 2: strided with 32-bit indices,
    /// 3: strided with 64-bit indices (see elementwise.cuh).
    pub mode: i32,
    /// Each operand's pointer advanced to its layout's offset.
    pub ptrs: [u64; K],
    pub args: StridedArgs<K>,
}

/// Plans an element-wise kernel: `ops` are (base pointer, layout, element size). With
/// `force_strided`, the strided arguments are filled in even for contiguous operands.
pub(crate) fn plan<const K: usize>(
    ops: [(u64, &Layout, usize); K],
    force_strided: bool,
    op: &'static str,
) -> Result<ElementwisePlan<K>> {
    let n = ops[0].1.elem_count() as u64;
    let ptrs = std::array::from_fn(|k| ops[k].0 + (ops[k].1.offset() * ops[k].2) as u64);
    if !force_strided && ops.iter().all(|(_, l, _)| l.is_contiguous()) {
        let aligned = ptrs.iter().all(|p| p % 16 == 0);
        return Ok(ElementwisePlan {
            n,
            mode: if aligned { 0 } else { 1 },
            ptrs,
            args: StridedArgs::zeroed(),
        });
    }
    let layouts: [&Layout; K] = std::array::from_fn(|k| ops[k].1);
    let (dims, strides) = merge_dims(layouts);
    if dims.len() > 8 {
        return Err(Error::Msg(format!(
            "{op} on CUDA: layouts {:?} need {} dims after merging; at most 8 are supported",
            ops[0].1.shape(),
            dims.len()
        )));
    }
    let mut args = StridedArgs::zeroed();
    args.rank = dims.len() as u32;
    let mut fits32 = n < u32::MAX as u64;
    for (d, &e) in dims.iter().enumerate() {
        args.dims[d] = e as u64;
    }
    for (dst, src) in args.strides.iter_mut().zip(&strides) {
        let mut max_off = 0u64;
        for (d, (&e, &s)) in dims.iter().zip(src.iter()).enumerate() {
            dst[d] = s as u64;
            max_off += (e as u64 - 1) * s as u64;
        }
        fits32 &= max_off < u32::MAX as u64;
    }
    Ok(ElementwisePlan {
        n,
        mode: if fits32 { 2 } else { 3 },
        ptrs,
        args,
    })
}

pub(crate) const BLOCK: u32 = 256;

/// A 1-D launch of `work` items at `BLOCK` threads per block, capped so a grid-stride loop
/// keeps every multiprocessor busy without an oversized grid.
pub(crate) fn grid_1d(dev: &CudaDevice, work: u64) -> LaunchConfig {
    let cap = (dev.info.multiprocessors as u64 * 32).max(1);
    let blocks = work.div_ceil(BLOCK as u64).clamp(1, cap) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Position of a dtype in [`DType::ALL`] (the order of the kernel-name tables).
pub(crate) fn dtype_index(dtype: DType) -> usize {
    match dtype {
        DType::F16 => 0,
        DType::BF16 => 1,
        DType::F32 => 2,
        DType::F64 => 3,
        DType::U8 => 4,
        DType::U32 => 5,
        DType::I64 => 6,
    }
}

/// `[prefix_f16, prefix_bf16, ..]` in [`DType::ALL`] order, as static strings.
macro_rules! kernel_names {
    ($prefix:literal) => {
        [
            concat!($prefix, "_f16"),
            concat!($prefix, "_bf16"),
            concat!($prefix, "_f32"),
            concat!($prefix, "_f64"),
            concat!($prefix, "_u8"),
            concat!($prefix, "_u32"),
            concat!($prefix, "_i64"),
        ]
    };
}
pub(crate) use kernel_names;

/// The kernel `prefix_dtype` from a table made by `kernel_names!`.
pub(crate) fn name_for(table: &[&'static str; 7], dtype: DType) -> &'static str {
    table[dtype_index(dtype)]
}

pub(crate) fn launch_err(name: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("launching {name}: {e:?}"))
}

/// The index of the fastest of `count` candidates, each run by `run(i)` on the device's
/// stream, timed with device events around `reps` back-to-back repeats in each of `rounds` (so a launch-bound
/// candidate pays its host cost too) after one warm-up run; `None` when none ran. Rounds
/// interleave the candidates and each keeps its best round: a GPU still raising its clocks
/// slows every candidate alike within a round instead of favouring whichever ran last. A
/// candidate that fails is skipped, not fatal.
pub(crate) fn fastest(
    dev: &CudaDevice,
    count: usize,
    rounds_reps: [usize; 2],
    run: impl FnMut(usize) -> Result<()>,
) -> Result<Option<usize>> {
    let times = time_candidates(dev, count, rounds_reps, run)?;
    Ok(times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i))
}

/// What [`fastest`] measures: each candidate's best round in milliseconds (for `reps`
/// repeats), infinite for one that failed.
pub(crate) fn time_candidates(
    dev: &CudaDevice,
    count: usize,
    rounds_reps: [usize; 2],
    run: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<f32>> {
    let samples = round_samples(dev, count, rounds_reps, run)?;
    Ok(samples
        .iter()
        .map(|s| s.iter().copied().fold(f32::INFINITY, f32::min))
        .collect())
}

/// Each candidate's median over `rounds` of one call timed alone, as a user's single call
/// sees it: events around the call, and the call waited for before the next (so the host's
/// cost of queuing it counts, and nothing overlaps it). Candidates interleave within a
/// round; infinite for one that failed.
pub(crate) fn time_single_calls(
    dev: &CudaDevice,
    count: usize,
    rounds: usize,
    run: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<f32>> {
    let samples = round_samples(dev, count, [rounds, 1], run)?;
    Ok(samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f32::total_cmp);
            s.get(s.len() / 2).copied().unwrap_or(f32::INFINITY)
        })
        .collect())
}

/// The milliseconds of each of `rounds` rounds per candidate, a round being `reps`
/// back-to-back runs between two device events, read (so waited for) before the next round;
/// candidates interleave within a round after one untimed run each, and one whose untimed
/// run or any timed run fails has no sample from it.
fn round_samples(
    dev: &CudaDevice,
    count: usize,
    [rounds, reps]: [usize; 2],
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<Vec<f32>>> {
    use cudarc::driver::sys::CUevent_flags;
    let err = |e: cudarc::driver::DriverError| Error::Cuda(format!("timing candidates: {e:?}"));
    let event = || {
        dev.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(err)
    };
    let (start, end) = (event()?, event()?);
    let usable: Vec<usize> = (0..count).filter(|&i| run(i).is_ok()).collect();
    let mut samples = vec![Vec::with_capacity(rounds); count];
    for _ in 0..rounds {
        for &i in &usable {
            start.record(&dev.stream).map_err(err)?;
            let ok = (0..reps).all(|_| run(i).is_ok());
            end.record(&dev.stream).map_err(err)?;
            end.synchronize().map_err(err)?;
            let ms = start.elapsed_ms(&end).map_err(err)?;
            if ok {
                samples[i].push(ms);
            }
        }
    }
    dev.note_bound();
    Ok(samples)
}
