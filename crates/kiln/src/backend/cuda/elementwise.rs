//! Element-wise ops on CUDA: one kernel per dtype and family, the op chosen by a code that
//! is uniform across the grid (see `kernels/elementwise.cuh`).

use super::compile::KernelSource;
use super::launch::{grid_1d, kernel_names, name_for, plan, ElementwisePlan};
use super::CudaStorage;
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, UnaryOp};
use crate::{DType, Error, Result};

/// (code, p0, p1) of a unary op; codes match the `U_*` defines of elementwise.cuh.
fn unary_code(op: UnaryOp) -> (i32, f64, f64) {
    match op {
        UnaryOp::Neg => (0, 0.0, 0.0),
        UnaryOp::Abs => (1, 0.0, 0.0),
        UnaryOp::Sqr => (2, 0.0, 0.0),
        UnaryOp::Relu => (3, 0.0, 0.0),
        UnaryOp::Exp => (4, 0.0, 0.0),
        UnaryOp::Log => (5, 0.0, 0.0),
        UnaryOp::Sqrt => (6, 0.0, 0.0),
        UnaryOp::Recip => (7, 0.0, 0.0),
        UnaryOp::Sin => (8, 0.0, 0.0),
        UnaryOp::Cos => (9, 0.0, 0.0),
        UnaryOp::Tanh => (10, 0.0, 0.0),
        UnaryOp::Sigmoid => (11, 0.0, 0.0),
        UnaryOp::Erf => (30, 0.0, 0.0),
        UnaryOp::GeluErf => (12, 0.0, 0.0),
        UnaryOp::GeluTanh => (13, 0.0, 0.0),
        UnaryOp::Silu => (14, 0.0, 0.0),
        UnaryOp::GeluErfGrad => (26, 0.0, 0.0),
        UnaryOp::GeluTanhGrad => (27, 0.0, 0.0),
        UnaryOp::Clamp(lo, hi) => (15, lo, hi),
        UnaryOp::Scalar {
            op,
            value,
            reversed,
        } => {
            let code = match (op, reversed) {
                (BinaryOp::Add, _) => 16,
                (BinaryOp::Sub, false) => 17,
                (BinaryOp::Sub, true) => 18,
                (BinaryOp::Mul, _) => 19,
                (BinaryOp::Div, false) => 20,
                (BinaryOp::Div, true) => 21,
                (BinaryOp::Maximum, _) => 22,
                (BinaryOp::Minimum, _) => 23,
                (BinaryOp::Pow, false) => 24,
                (BinaryOp::Pow, true) => 25,
                (BinaryOp::ReluGrad, false) => 28,
                (BinaryOp::ReluGrad, true) => 29,
                (BinaryOp::AddRelu | BinaryOp::MulRelu | BinaryOp::CountFinite, _) => {
                    unreachable!("scalar forms are refused by Tensor::unary")
                }
            };
            (code, value, 0.0)
        }
    }
}

fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Maximum => 4,
        BinaryOp::Minimum => 5,
        BinaryOp::Pow => 6,
        BinaryOp::ReluGrad => 7,
        BinaryOp::AddRelu => 8,
        BinaryOp::MulRelu => 9,
        BinaryOp::CountFinite => 10,
    }
}

fn cmp_code(op: CmpOp) -> i32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Ne => 1,
        CmpOp::Lt => 2,
        CmpOp::Le => 3,
        CmpOp::Gt => 4,
        CmpOp::Ge => 5,
    }
}

const UNARY: [&str; 7] = kernel_names!("unary");
const BINARY: [&str; 7] = kernel_names!("binary");
const BINARY_CONTIGUOUS: [&str; 7] = kernel_names!("binary_c");
const CMP: [&str; 7] = kernel_names!("cmp");
const WHERE: [&str; 7] = kernel_names!("where");
const FILL: [&str; 7] = kernel_names!("fill");
const DROPOUT_MASK: [&str; 7] = kernel_names!("dropout_mask");
const AFFINE: [&str; 7] = kernel_names!("affine");
const CAST: [[&str; 7]; 7] = [
    kernel_names!("cast_f16"),
    kernel_names!("cast_bf16"),
    kernel_names!("cast_f32"),
    kernel_names!("cast_f64"),
    kernel_names!("cast_u8"),
    kernel_names!("cast_u32"),
    kernel_names!("cast_i64"),
];

fn contiguous_out(x: &CudaStorage, l: &Layout, dtype: DType) -> Result<(CudaStorage, Layout)> {
    let out = CudaStorage::alloc(x.dev(), l.elem_count(), dtype)?;
    Ok((out, Layout::contiguous(l.shape().clone())))
}

pub(super) fn unary(x: &CudaStorage, l: &Layout, op: UnaryOp) -> Result<CudaStorage> {
    let (out, ol) = contiguous_out(x, l, x.dtype)?;
    let sz = x.dtype.size_in_bytes();
    let ElementwisePlan {
        n,
        mode,
        ptrs,
        args,
    } = plan(
        [(out.buf.ptr, &ol, sz), (x.buf.ptr, l, sz)],
        false,
        op.name(),
    )?;
    if n == 0 {
        return Ok(out);
    }
    let (code, p0, p1) = unary_code(op);
    let dev = x.dev();
    let name = name_for(&UNARY, x.dtype);
    let grid = work_grid(&out, n, mode);
    let args: &mut [&mut dyn super::device::KernelArg] = &mut [
        &mut { n },
        &mut { ptrs[1] },
        &mut { ptrs[0] },
        &mut { code },
        &mut { p0 },
        &mut { p1 },
        &mut { mode },
        &mut { args },
    ];
    // SAFETY: the plan's pointers address `n` elements of the operands' layouts inside their
    // buffers; the parameters match `unary_<T>` in unary.cu.
    // The op is compiled into the kernel: one small module per (dtype, op).
    unsafe { dev.call_variant(KernelSource::Unary, name, Some(code as u8), grid, args) }?;
    Ok(out)
}

/// Grid for `n` elements: vector mode processes 16 bytes per thread.
fn work_grid(out: &CudaStorage, n: u64, mode: i32) -> cudarc::driver::LaunchConfig {
    let per = if mode == 0 {
        (16 / out.dtype.size_in_bytes()) as u64
    } else {
        1
    };
    grid_1d(out.dev(), n.div_ceil(per))
}

pub(super) fn binary(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> Result<CudaStorage> {
    let (out, ol) = contiguous_out(a, la, a.dtype)?;
    binary_into(a, la, b, lb, op, out.buf.ptr, &ol)?;
    Ok(out)
}

/// `a[la] = a[la] op b[lb]` in place: the output is `a` itself at `la` (each element is
/// read before it is written, by the same thread).
pub(super) fn binary_assign(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> Result<()> {
    binary_into(a, la, b, lb, op, a.buf.ptr, la)
}

/// The binary kernel over `a` and `b` writing `out` (a buffer of `a`'s dtype) at `ol`.
fn binary_into(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
    out: u64,
    ol: &Layout,
) -> Result<()> {
    let sz = a.dtype.size_in_bytes();
    let ElementwisePlan {
        n,
        mode,
        ptrs,
        args,
    } = plan(
        [(out, ol, sz), (a.buf.ptr, la, sz), (b.buf.ptr, lb, sz)],
        false,
        op.name(),
    )?;
    if n == 0 {
        return Ok(());
    }
    let code = binary_code(op);
    let dev = a.dev();
    let grid = work_grid(a, n, mode);
    if mode <= 1 {
        let name = name_for(&BINARY_CONTIGUOUS, a.dtype);
        // SAFETY: as in `unary`; matches `binary_c_<T>` (contiguous operands, no strided block).
        unsafe {
            dev.call(
                KernelSource::Binary,
                name,
                grid,
                &mut [
                    &mut { n },
                    &mut { ptrs[1] },
                    &mut { ptrs[2] },
                    &mut { ptrs[0] },
                    &mut { code },
                    &mut { mode },
                ],
            )
        }?;
    } else {
        let name = name_for(&BINARY, a.dtype);
        // SAFETY: as in `unary`; matches `binary_<T>`.
        unsafe {
            dev.call(
                KernelSource::Binary,
                name,
                grid,
                &mut [
                    &mut { n },
                    &mut { ptrs[1] },
                    &mut { ptrs[2] },
                    &mut { ptrs[0] },
                    &mut { code },
                    &mut { mode },
                    &mut { args },
                ],
            )
        }?;
    }
    Ok(())
}

pub(super) fn compare(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: CmpOp,
) -> Result<CudaStorage> {
    let (out, ol) = contiguous_out(a, la, DType::U8)?;
    let sz = a.dtype.size_in_bytes();
    // The u8 output differs in width from the inputs, so the vector path does not apply.
    let ElementwisePlan {
        n,
        mut mode,
        ptrs,
        args,
    } = plan(
        [
            (out.buf.ptr, &ol, 1),
            (a.buf.ptr, la, sz),
            (b.buf.ptr, lb, sz),
        ],
        false,
        op.name(),
    )?;
    if n == 0 {
        return Ok(out);
    }
    if mode == 0 && sz != 1 {
        mode = 1;
    }
    let code = cmp_code(op);
    let dev = a.dev();
    let name = name_for(&CMP, a.dtype);
    // SAFETY: as in `unary`; matches `cmp_<T>`.
    unsafe {
        dev.call(
            KernelSource::Binary,
            name,
            work_grid(&out, n, mode),
            &mut [
                &mut { n },
                &mut { ptrs[1] },
                &mut { ptrs[2] },
                &mut { ptrs[0] },
                &mut { code },
                &mut { mode },
                &mut { args },
            ],
        )
    }?;
    Ok(out)
}

pub(super) fn where_cond(
    c: &CudaStorage,
    lc: &Layout,
    t: &CudaStorage,
    lt: &Layout,
    f: &CudaStorage,
    lf: &Layout,
) -> Result<CudaStorage> {
    // The kernel reads the condition as u8; any other dtype becomes `cond != 0` first.
    let (cond, lc) = if c.dtype == DType::U8 {
        (None, lc.clone())
    } else {
        let zero = CudaStorage::full(c.dev(), 0.0, 1, c.dtype)?;
        let zl = Layout::contiguous(1).broadcast_as(lc.shape().clone())?;
        (
            Some(compare(c, lc, &zero, &zl, CmpOp::Ne)?),
            Layout::contiguous(lc.shape().clone()),
        )
    };
    let c = cond.as_ref().unwrap_or(c);
    let (out, ol) = contiguous_out(t, lt, t.dtype)?;
    let sz = t.dtype.size_in_bytes();
    let ElementwisePlan {
        n,
        mode,
        ptrs,
        args,
    } = plan(
        [
            (out.buf.ptr, &ol, sz),
            (c.buf.ptr, &lc, 1),
            (t.buf.ptr, lt, sz),
            (f.buf.ptr, lf, sz),
        ],
        true,
        "where_cond",
    )?;
    if n == 0 {
        return Ok(out);
    }
    let dev = t.dev();
    let name = name_for(&WHERE, t.dtype);
    // SAFETY: as in `unary`; matches `where_<T>` (strided arguments always filled in).
    unsafe {
        dev.call(
            KernelSource::Binary,
            name,
            grid_1d(dev, n),
            &mut [
                &mut { n },
                &mut { ptrs[1] },
                &mut { ptrs[2] },
                &mut { ptrs[3] },
                &mut { ptrs[0] },
                &mut { mode },
                &mut { args },
            ],
        )
    }?;
    Ok(out)
}

/// `x · s + h` elementwise in one kernel (all of one shape and dtype).
pub(super) fn affine(
    x: &CudaStorage,
    lx: &Layout,
    s: &CudaStorage,
    ls: &Layout,
    h: &CudaStorage,
    lh: &Layout,
) -> Result<CudaStorage> {
    let (out, ol) = contiguous_out(x, lx, x.dtype)?;
    let sz = x.dtype.size_in_bytes();
    let ElementwisePlan {
        n,
        mode,
        ptrs,
        args,
    } = plan(
        [
            (out.buf.ptr, &ol, sz),
            (x.buf.ptr, lx, sz),
            (s.buf.ptr, ls, sz),
            (h.buf.ptr, lh, sz),
        ],
        true,
        "affine",
    )?;
    if n == 0 {
        return Ok(out);
    }
    let dev = x.dev();
    // SAFETY: as in `unary`; matches `affine_<T>` (strided arguments always filled in).
    unsafe {
        dev.call(
            KernelSource::Binary,
            name_for(&AFFINE, x.dtype),
            grid_1d(dev, n),
            &mut [
                &mut { n },
                &mut { ptrs[1] },
                &mut { ptrs[2] },
                &mut { ptrs[3] },
                &mut { ptrs[0] },
                &mut { mode },
                &mut { args },
            ],
        )
    }?;
    Ok(out)
}

/// Launches `cast_<from>_<to>` from `x` at `lx` into `y` at `ly` (same shape).
fn cast_into(x: &CudaStorage, lx: &Layout, y: &CudaStorage, ly: &Layout) -> Result<()> {
    let ElementwisePlan {
        n,
        mode,
        ptrs,
        args,
    } = plan(
        [
            (y.buf.ptr, ly, y.dtype.size_in_bytes()),
            (x.buf.ptr, lx, x.dtype.size_in_bytes()),
        ],
        false,
        "cast",
    )?;
    if n == 0 {
        return Ok(());
    }
    let dev = x.dev();
    let name = CAST[super::launch::dtype_index(x.dtype)][super::launch::dtype_index(y.dtype)];
    let per = if mode == 0 && x.dtype == y.dtype {
        (16 / x.dtype.size_in_bytes()) as u64
    } else {
        1
    };
    let grid = grid_1d(dev, n.div_ceil(per));
    // SAFETY: as in `unary`; matches `cast_<I>_<O>`.
    unsafe {
        dev.call(
            KernelSource::Cast,
            name,
            grid,
            &mut [
                &mut { n },
                &mut { ptrs[1] },
                &mut { ptrs[0] },
                &mut { mode },
                &mut { args },
            ],
        )
    }
}

pub(super) fn cast(x: &CudaStorage, l: &Layout, dtype: DType) -> Result<CudaStorage> {
    let (out, ol) = contiguous_out(x, l, dtype)?;
    cast_into(x, l, &out, &ol)?;
    Ok(out)
}

pub(super) fn copy_into(
    x: &CudaStorage,
    l: &Layout,
    dst: &mut CudaStorage,
    dl: &Layout,
) -> Result<()> {
    if x.dtype != dst.dtype {
        return Err(Error::DTypeMismatch {
            op: "copy_into",
            lhs: x.dtype,
            rhs: dst.dtype,
        });
    }
    cast_into(x, l, dst, dl)
}

/// A dropout mask of `n` elements of `dtype` (see `BackendStorage::dropout_mask`), its step
/// read by the kernel from the i64 at `step_offset` of `step`.
pub(super) fn dropout_mask(
    step: &CudaStorage,
    step_offset: usize,
    n: usize,
    dtype: DType,
    draw: &crate::op::DropoutDraw,
) -> Result<CudaStorage> {
    debug_assert_eq!(step.dtype, DType::I64);
    let dev = step.dev();
    let out = CudaStorage::alloc(dev, n, dtype)?;
    if n == 0 {
        return Ok(out);
    }
    let name = name_for(&DROPOUT_MASK, dtype);
    let (n64, step_ptr, y) = (n as u64, step.ptr_at(step_offset), out.buf.ptr);
    // SAFETY: `step` holds an i64 at `step_offset` (one element, checked by the tensor
    // layer), `out` holds `n` elements of `dtype`; matches `dropout_mask_<T>`.
    unsafe {
        dev.call(
            KernelSource::Binary,
            name,
            grid_1d(dev, n64),
            &mut [
                &mut { n64 },
                &mut { step_ptr },
                &mut { y },
                &mut { draw.seed },
                &mut { draw.threshold },
                &mut { draw.scale },
            ],
        )
    }?;
    Ok(out)
}

pub(super) fn fill(out: &CudaStorage, value: f64) -> Result<()> {
    let n = out.len as u64;
    if n == 0 {
        return Ok(());
    }
    let dev = out.dev();
    let name = name_for(&FILL, out.dtype);
    // SAFETY: `out` holds `n` elements; matches `fill_<T>`.
    unsafe {
        dev.call(
            KernelSource::Binary,
            name,
            grid_1d(dev, n),
            &mut [&mut { n }, &mut { out.buf.ptr }, &mut { value }],
        )
    }
}
