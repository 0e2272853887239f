//! Fused training kernels on CUDA: softmax cross-entropy (`kernels/loss.cu`: loss, gradient and
//! argmax hit of a row in one launch, one warp per row) and in-place optimizer updates
//! (`kernels/optim.cu`: one launch per parameter instead of four or more).

use super::compile::KernelSource;
use super::launch::{grid_1d, name_for};
use super::CudaStorage;
use crate::layout::Layout;
use crate::op::{CrossEntropyRows, UpdateRule};
use crate::{DType, Error, Result};
use cudarc::driver::LaunchConfig;
use std::sync::atomic::Ordering;

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

pub(super) fn cross_entropy(
    x: &CudaStorage,
    l: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
    smoothing: f64,
    scale: f64,
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
        // SAFETY: x's layout (n×c at strides rs, cs from x_ptr) and the targets' (n at ts)
        // index inside their buffers (the tensor layer's layout invariant); loss, grad and
        // correct hold n, n*c and n elements; the arguments match `cross_entropy_<T>`.
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
                    &mut { dev.error_flag },
                ],
            )
        }?;
        // Armed after the launch is queued: a check that sees it reads the flag after the kernel.
        dev.flag_armed.store(true, Ordering::Release);
    }
    Ok(CrossEntropyRows {
        loss,
        grad,
        correct,
    })
}

pub(super) fn update(
    p: &mut CudaStorage,
    l: &Layout,
    g: &CudaStorage,
    gl: &Layout,
    state: &mut [(&mut CudaStorage, &Layout)],
    rule: UpdateRule,
) -> Result<()> {
    float_only(p.dtype, rule.name())?;
    for other in [g.dtype]
        .into_iter()
        .chain(state.iter().map(|(s, _)| s.dtype))
    {
        if other != p.dtype {
            return Err(Error::DTypeMismatch {
                op: rule.name(),
                lhs: p.dtype,
                rhs: other,
            });
        }
    }
    let n = l.elem_count() as u64;
    if n == 0 {
        return Ok(());
    }
    let dev = p.dev();
    let (p_ptr, g_ptr) = (p.ptr_at(l.offset()), g.ptr_at(gl.offset()));
    let st: Vec<u64> = state.iter().map(|(s, sl)| s.ptr_at(sl.offset())).collect();
    let cfg = grid_1d(dev, n);
    match rule {
        UpdateRule::Sgd {
            lr,
            momentum,
            nesterov,
            weight_decay,
        } => {
            let v_ptr = st.first().copied().unwrap_or(0);
            let nesterov = i32::from(nesterov);
            // SAFETY: p, g and (when non-null) v hold n contiguous elements from their
            // offsets (checked by the tensor layer); the arguments match `sgd_<T>`.
            unsafe {
                dev.call(
                    KernelSource::Optim,
                    name_for(&SGD, p.dtype),
                    cfg,
                    &mut [
                        &mut { n },
                        &mut { p_ptr },
                        &mut { g_ptr },
                        &mut { v_ptr },
                        &mut { lr },
                        &mut { momentum },
                        &mut { weight_decay },
                        &mut { nesterov },
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
            step,
        } => {
            let [m_ptr, v_ptr] = st[..] else {
                return Err(Error::Msg(format!(
                    "adam_update: expected 2 state buffers, got {}",
                    st.len()
                )));
            };
            let step_size = lr / (1.0 - beta1.powi(step as i32));
            let inv_bc2 = 1.0 / (1.0 - beta2.powi(step as i32));
            let decoupled = i32::from(decoupled);
            // SAFETY: p, g, m and v hold n contiguous elements from their offsets (checked
            // by the tensor layer); the arguments match `adam_<T>`.
            unsafe {
                dev.call(
                    KernelSource::Optim,
                    name_for(&ADAM, p.dtype),
                    cfg,
                    &mut [
                        &mut { n },
                        &mut { p_ptr },
                        &mut { g_ptr },
                        &mut { m_ptr },
                        &mut { v_ptr },
                        &mut { lr },
                        &mut { beta1 },
                        &mut { beta2 },
                        &mut { eps },
                        &mut { weight_decay },
                        &mut { decoupled },
                        &mut { step_size },
                        &mut { inv_bc2 },
                    ],
                )
            }
        }
    }
}
