//! Fused training kernels on CUDA: softmax cross-entropy (`kernels/loss.cu`: loss, gradient and
//! argmax hit of a row in one launch, one warp per row) and in-place optimizer updates
//! (`kernels/optim.cu`: one launch for up to eight parameters).

use super::compile::KernelSource;
use super::launch::{grid_1d, name_for};
use super::CudaStorage;
use crate::backend::UpdateSlot;
use crate::layout::Layout;
use crate::op::{CrossEntropyRows, UpdateRule};
use crate::{DType, Error, Result};
use cudarc::driver::LaunchConfig;

/// Kernel names for the four float dtypes, indexed like [`name_for`]'s tables.
macro_rules! float_names {
    ($p:literal) => {
        [
            concat!($p, "_f16"),
            concat!($p, "_bf16"),
            concat!($p, "_f32"),
            concat!($p, "_f64"),
            "",
            "",
            "",
        ]
    };
}

const CROSS_ENTROPY: [&str; 7] = float_names!("cross_entropy");
const SGD: [&str; 7] = float_names!("sgd");
const ADAM: [&str; 7] = float_names!("adam");

fn float_only(dtype: DType, op: &'static str) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype })
    }
}

/// The fused cross-entropy; with `sums` (device pointers of three f32 vectors of `n`: the
/// loss sum, the finite-step counts and the hits), the same launch also updates an epoch's
/// running sums (see `BackendStorage::cross_entropy_accumulate`).
pub(super) fn cross_entropy(
    x: &CudaStorage,
    l: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
    smoothing: f64,
    scale: f64,
    sums: Option<[u64; 3]>,
) -> Result<CrossEntropyRows<CudaStorage>> {
    float_only(x.dtype, "cross_entropy")?;
    let (t, tl) = match targets.dtype {
        DType::I64 => (None, tl.clone()),
        DType::U8 | DType::U32 => (
            Some(super::elementwise::cast(targets, tl, DType::I64)?),
            Layout::contiguous(tl.shape().clone()),
        ),
        dtype => {
            return Err(Error::UnsupportedDType {
                op: "cross_entropy (targets)",
                dtype,
            })
        }
    };
    let t = t.as_ref().unwrap_or(targets);
    let dev = x.dev();
    let (n, c) = (l.dims()[0], l.dims()[1]);
    let loss = CudaStorage::alloc(dev, n, x.dtype)?;
    let grad = CudaStorage::alloc(dev, n * c, x.dtype)?;
    let correct = CudaStorage::alloc(dev, n, DType::F32)?;
    if n > 0 {
        // One warp per row, 8 rows a block, at most 32 blocks per multiprocessor.
        let blocks = n.div_ceil(8).clamp(1, dev.info.multiprocessors.max(1) * 32);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (x_ptr, t_ptr) = (x.ptr_at(l.offset()), t.ptr_at(tl.offset()));
        let (n64, c64) = (n as u64, c as u64);
        let (rs, cs, ts) = (
            l.strides()[0] as i64,
            l.strides()[1] as i64,
            tl.strides()[0] as i64,
        );
        let [loss_sum, finite, hits] = sums.unwrap_or([0; 3]);
        // SAFETY: x's layout (n×c at strides rs, cs from x_ptr) and the targets' (n at ts)
        // index inside their buffers (the tensor layer's layout invariant); loss, grad and
        // correct hold n, n*c and n elements; the sums, when given, are n f32 each (the
        // caller's contract); the arguments match `cross_entropy_<T>`.
        unsafe {
            dev.call(
                KernelSource::Loss,
                name_for(&CROSS_ENTROPY, x.dtype),
                cfg,
                &mut [
                    &mut { x_ptr },
                    &mut { n64 },
                    &mut { c64 },
                    &mut { rs },
                    &mut { cs },
                    &mut { t_ptr },
                    &mut { ts },
                    &mut { smoothing },
                    &mut { scale },
                    &mut { loss.buf.ptr },
                    &mut { grad.buf.ptr },
                    &mut { correct.buf.ptr },
                    &mut { loss_sum },
                    &mut { finite },
                    &mut { hits },
                    &mut { dev.error_flag },
                ],
            )
        }?;
        // Armed after the launch is queued: a check that sees it reads the flag after the kernel.
        dev.arm_flag();
    }
    Ok(CrossEntropyRows {
        loss,
        grad,
        correct,
    })
}

/// Mirrors `UpdateGroup` in optim.cu: up to [`GROUP`] parameters of one launch.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UpdateGroup {
    n: [u64; GROUP],
    p: [u64; GROUP],
    g: [u64; GROUP],
    s0: [u64; GROUP],
    s1: [u64; GROUP],
}

const GROUP: usize = 8;

// SAFETY: a #[repr(C)] struct of integers, laid out as the C struct it mirrors.
unsafe impl cudarc::driver::DeviceRepr for UpdateGroup {}

/// Updates every slot by `rule`, [`GROUP`] parameters per launch (an MLP's step is one).
pub(super) fn update_group(
    slots: &mut [UpdateSlot<'_, CudaStorage>],
    rule: UpdateRule,
    schedule: Option<&CudaStorage>,
) -> Result<()> {
    let Some(first) = slots.first() else {
        return Ok(());
    };
    let dtype = first.param.dtype;
    let dev = first.param.dev().clone();
    float_only(dtype, rule.name())?;
    let want_state = rule.state_len();
    for s in slots.iter() {
        let others = [s.param.dtype, s.grad.dtype]
            .into_iter()
            .chain(s.state.iter().map(|(b, _)| b.dtype));
        for other in others {
            if other != dtype {
                return Err(Error::DTypeMismatch {
                    op: rule.name(),
                    lhs: dtype,
                    rhs: other,
                });
            }
        }
        if s.state.len() != want_state {
            return Err(Error::Msg(format!(
                "{}: expected {want_state} state buffers, got {}",
                rule.name(),
                s.state.len()
            )));
        }
    }
    let live: Vec<&UpdateSlot<'_, CudaStorage>> =
        slots.iter().filter(|s| s.layout.elem_count() > 0).collect();
    for chunk in live.chunks(GROUP) {
        let mut group = UpdateGroup::default();
        for (i, s) in chunk.iter().enumerate() {
            group.n[i] = s.layout.elem_count() as u64;
            group.p[i] = s.param.ptr_at(s.layout.offset());
            group.g[i] = s.grad.ptr_at(s.grad_layout.offset());
            let st = |k: usize| s.state.get(k).map_or(0, |(b, l)| b.ptr_at(l.offset()));
            (group.s0[i], group.s1[i]) = (st(0), st(1));
        }
        let longest = group.n.iter().copied().max().unwrap_or(1);
        let mut cfg = grid_1d(&dev, longest);
        // Each tensor gets its share of the blocks; blockIdx.y picks the tensor.
        cfg.grid_dim.0 = cfg.grid_dim.0.div_ceil(chunk.len() as u32).max(1);
        cfg.grid_dim.1 = chunk.len() as u32;
        let schedule = schedule.map_or(0, |s| s.buf.ptr);
        launch_update(&dev, dtype, cfg, group, rule, schedule)?;
    }
    Ok(())
}

fn launch_update(
    dev: &super::CudaDevice,
    dtype: DType,
    cfg: LaunchConfig,
    group: UpdateGroup,
    rule: UpdateRule,
    schedule: u64,
) -> Result<()> {
    match rule {
        UpdateRule::Sgd {
            lr,
            momentum,
            nesterov,
            weight_decay,
        } => {
            let nesterov = i32::from(nesterov);
            // SAFETY: each of the group's first grid_dim.y entries holds a parameter, a
            // gradient and (when non-null) a velocity of n contiguous elements of `dtype`
            // (checked by the tensor layer and above); the arguments match `sgd_<T>`.
            unsafe {
                dev.call(
                    KernelSource::Optim,
                    name_for(&SGD, dtype),
                    cfg,
                    &mut [
                        &mut { group },
                        &mut { lr },
                        &mut { momentum },
                        &mut { weight_decay },
                        &mut { nesterov },
                        &mut { schedule },
                    ],
                )
            }
        }
        UpdateRule::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            step: _,
        } => {
            let (step_size, inv_bc2) = rule.adam_scales().expect("an Adam rule");
            let decoupled = i32::from(decoupled);
            // SAFETY: as for SGD, with both moment buffers present (state length checked
            // above); the arguments match `adam_<T>`.
            unsafe {
                dev.call(
                    KernelSource::Optim,
                    name_for(&ADAM, dtype),
                    cfg,
                    &mut [
                        &mut { group },
                        &mut { lr },
                        &mut { beta1 },
                        &mut { beta2 },
                        &mut { eps },
                        &mut { weight_decay },
                        &mut { decoupled },
                        &mut { step_size },
                        &mut { inv_bc2 },
                        &mut { schedule },
                    ],
                )
            }
        }
    }
}
