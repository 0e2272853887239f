//! The CPU backend: host vectors, contiguous fast paths the compiler vectorises, a strided
//! path for every other layout, rayon above a size threshold, and the `gemm` crate for
//! matrix products.

mod chunked;
mod conv;
mod conv_direct;
mod conv_winograd;
mod disjoint;
mod elem;
mod elementwise;
mod fused;
pub(crate) mod host_memory;
pub(crate) mod hot_helper;
mod index;
mod matmul;
mod reduce;
pub(crate) mod simd;
mod sparse;
pub(crate) mod strided;
pub(crate) mod threads;
mod window;

use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, CrossEntropyRows, ReduceOp, UnaryOp, UpdateRule};
use crate::{DType, Device, Error, Result, WithDType};
use half::{bf16, f16};

/// Host memory of one dtype: the CPU backend's storage. The enum itself is
/// [`crate::dtype::TypedVec`], defined beside the dtypes so that they need nothing from here.
pub type CpuStorage = crate::dtype::TypedVec;

/// Runs `$body` with `$v` bound to the typed vector, whatever the dtype.
macro_rules! match_storage {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            CpuStorage::F16($v) => $body,
            CpuStorage::BF16($v) => $body,
            CpuStorage::F32($v) => $body,
            CpuStorage::F64($v) => $body,
            CpuStorage::U8($v) => $body,
            CpuStorage::U32($v) => $body,
            CpuStorage::I64($v) => $body,
        }
    };
}
pub(crate) use match_storage;

/// Runs `$float` for float dtypes and `$int` for integer ones, `$v` bound to the vector.
macro_rules! match_float_int {
    ($s:expr, $v:ident => float: $float:expr, int: $int:expr) => {
        match $s {
            CpuStorage::F16($v) => $float,
            CpuStorage::BF16($v) => $float,
            CpuStorage::F32($v) => $float,
            CpuStorage::F64($v) => $float,
            CpuStorage::U8($v) => {
                let _ = &$v;
                $int
            }
            CpuStorage::U32($v) => {
                let _ = &$v;
                $int
            }
            CpuStorage::I64($v) => {
                let _ = &$v;
                $int
            }
        }
    };
}

/// Runs `$body` with `$a` and `$b` bound to two vectors of the same dtype, or returns a
/// dtype-mismatch error naming `$op`.
macro_rules! match_same_dtype {
    ($op:expr, ($lhs:expr, $rhs:expr), ($a:ident, $b:ident) => $body:expr) => {
        match ($lhs, $rhs) {
            (CpuStorage::F16($a), CpuStorage::F16($b)) => $body,
            (CpuStorage::BF16($a), CpuStorage::BF16($b)) => $body,
            (CpuStorage::F32($a), CpuStorage::F32($b)) => $body,
            (CpuStorage::F64($a), CpuStorage::F64($b)) => $body,
            (CpuStorage::U8($a), CpuStorage::U8($b)) => $body,
            (CpuStorage::U32($a), CpuStorage::U32($b)) => $body,
            (CpuStorage::I64($a), CpuStorage::I64($b)) => $body,
            (l, r) => {
                return Err(Error::DTypeMismatch {
                    op: $op,
                    lhs: l.dtype(),
                    rhs: r.dtype(),
                })
            }
        }
    };
}

impl CpuStorage {
    pub fn from_vec<T: WithDType>(v: Vec<T>) -> Self {
        T::into_cpu_storage(v)
    }

    pub fn len(&self) -> usize {
        match_storage!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` copies of `value` (cast to `dtype`).
    pub fn full(value: f64, n: usize, dtype: DType) -> Self {
        fn make<T: WithDType>(v: f64, n: usize) -> CpuStorage {
            CpuStorage::from_vec(host_memory::filled_huge(T::from_f64(v), n))
        }
        match dtype {
            DType::F16 => make::<f16>(value, n),
            DType::BF16 => make::<bf16>(value, n),
            DType::F32 => make::<f32>(value, n),
            DType::F64 => make::<f64>(value, n),
            DType::U8 => make::<u8>(value, n),
            DType::U32 => make::<u32>(value, n),
            DType::I64 => make::<i64>(value, n),
        }
    }

    /// Builds storage of `dtype` from `f64` values.
    pub fn from_f64s(values: impl ExactSizeIterator<Item = f64>, dtype: DType) -> Self {
        fn make<T: WithDType>(v: impl ExactSizeIterator<Item = f64>) -> CpuStorage {
            let mut out = host_memory::with_capacity_huge(v.len());
            out.extend(v.map(T::from_f64));
            CpuStorage::from_vec(out)
        }
        match dtype {
            DType::F16 => make::<f16>(values),
            DType::BF16 => make::<bf16>(values),
            DType::F32 => make::<f32>(values),
            DType::F64 => make::<f64>(values),
            DType::U8 => make::<u8>(values),
            DType::U32 => make::<u32>(values),
            DType::I64 => make::<i64>(values),
        }
    }

    /// The typed slice, or a dtype error naming `op`.
    pub fn as_slice<T: WithDType>(&self, op: &'static str) -> Result<&[T]> {
        T::cpu_slice(self).ok_or(Error::DTypeMismatch {
            op,
            lhs: self.dtype(),
            rhs: T::DTYPE,
        })
    }

    pub fn as_mut_slice<T: WithDType>(&mut self, op: &'static str) -> Result<&mut [T]> {
        let dtype = self.dtype();
        T::cpu_slice_mut(self).ok_or(Error::DTypeMismatch {
            op,
            lhs: dtype,
            rhs: T::DTYPE,
        })
    }

    /// Reads every index of an integer tensor as `usize`, checking `0 <= id < size`.
    pub(crate) fn indices(
        &self,
        layout: &Layout,
        op: &'static str,
        dim: usize,
        size: usize,
    ) -> Result<Vec<usize>> {
        fn conv<T: WithDType>(
            v: &[T],
            l: &Layout,
            op: &'static str,
            dim: usize,
            size: usize,
        ) -> Result<Vec<usize>> {
            l.offsets()
                .map(|o| {
                    let i = v[o].to_f64() as i64;
                    if i < 0 || i as usize >= size {
                        Err(Error::IndexOutOfRange {
                            op,
                            index: i,
                            dim,
                            size,
                        })
                    } else {
                        Ok(i as usize)
                    }
                })
                .collect()
        }
        match self {
            CpuStorage::U8(v) => conv(v, layout, op, dim, size),
            CpuStorage::U32(v) => conv(v, layout, op, dim, size),
            CpuStorage::I64(v) => conv(v, layout, op, dim, size),
            s => Err(Error::UnsupportedDType {
                op,
                dtype: s.dtype(),
            }),
        }
    }
}

impl BackendStorage for CpuStorage {
    fn dtype(&self) -> DType {
        match self {
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::U8(_) => DType::U8,
            CpuStorage::U32(_) => DType::U32,
            CpuStorage::I64(_) => DType::I64,
        }
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        if self.dtype().is_int() && !op.supports_int() {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: self.dtype(),
            });
        }
        Ok(match_float_int!(self, v =>
            float: Self::from_vec(elementwise::unary_float(v, layout, op)),
            int: Self::from_vec(elementwise::unary_int(v, layout, op))))
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self> {
        if op == BinaryOp::Pow && self.dtype().is_int() {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: self.dtype(),
            });
        }
        use CpuStorage as S;
        let (l, r) = (layout, rhs_layout);
        Ok(match (self, rhs) {
            (S::F32(a), S::F32(b)) => S::F32(elementwise::binary_float(a, l, b, r, op)),
            (S::F64(a), S::F64(b)) => S::F64(elementwise::binary_float(a, l, b, r, op)),
            (S::F16(a), S::F16(b)) => S::F16(elementwise::binary_float(a, l, b, r, op)),
            (S::BF16(a), S::BF16(b)) => S::BF16(elementwise::binary_float(a, l, b, r, op)),
            _ => match_same_dtype!(op.name(), (self, rhs), (a, b) =>
                Self::from_vec(elementwise::binary(a, l, b, r, op))),
        })
    }

    fn binary_assign(
        &mut self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<()> {
        use CpuStorage as S;
        // Float operands in place, any layout; integers through the trait's default.
        let (l, r) = (layout, rhs_layout);
        match (&mut *self, rhs) {
            (S::F32(a), S::F32(b)) => elementwise::binary_assign(a, l, b, r, op),
            (S::F64(a), S::F64(b)) => elementwise::binary_assign(a, l, b, r, op),
            (S::F16(a), S::F16(b)) => elementwise::binary_assign(a, l, b, r, op),
            (S::BF16(a), S::BF16(b)) => elementwise::binary_assign(a, l, b, r, op),
            _ => return crate::backend::binary_assign_through_copy(self, l, rhs, r, op),
        }
        Ok(())
    }

    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self> {
        match_same_dtype!(op.name(), (self, rhs), (a, b) =>
            Ok(Self::U8(elementwise::compare(a, layout, b, rhs_layout, op))))
    }

    fn where_cond(
        &self,
        layout: &Layout,
        t: &Self,
        tl: &Layout,
        f: &Self,
        fl: &Layout,
    ) -> Result<Self> {
        match_storage!(self, c => match_same_dtype!("where_cond", (t, f), (a, b) =>
            Ok(Self::from_vec(strided::map3((c, layout), (a, tl), (b, fl), a.first().copied().unwrap_or(WithDType::ZERO),
                |c, x, y| if c != WithDType::ZERO { x } else { y })))))
    }

    fn cast(&self, layout: &Layout, dtype: DType) -> Result<Self> {
        Ok(elementwise::cast(self, layout, dtype))
    }

    fn copy_contiguous(&self, layout: &Layout) -> Result<Self> {
        Ok(match_storage!(self, v => Self::from_vec(copied(v, layout))))
    }

    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()> {
        match_same_dtype!("copy_into", (self, dst), (a, b) => strided::copy_into(a, layout, b, dst_layout));
        Ok(())
    }

    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        Ok(match_storage!(self, v => reduce::reduce(v, layout, dims, op)))
    }

    fn softmax(&self, layout: &Layout, dim: usize, log: bool) -> Result<Self> {
        let op = if log { "log_softmax" } else { "softmax" };
        match_float_int!(self, v =>
            float: Ok(Self::from_vec(reduce::softmax(v, layout, dim, log))),
            int: Err(Error::UnsupportedDType { op, dtype: self.dtype() }))
    }

    fn logsumexp(&self, layout: &Layout, dim: usize) -> Option<Result<Self>> {
        Some(match_float_int!(self, v =>
            float: Ok(Self::from_vec(reduce::logsumexp(v, layout, dim))),
            int: Err(Error::UnsupportedDType { op: "logsumexp", dtype: self.dtype() })))
    }

    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self> {
        matmul::matmul(self, layout, rhs, rhs_layout)
    }

    fn index_select(
        &self,
        layout: &Layout,
        ids: &Self,
        ids_layout: &Layout,
        dim: usize,
    ) -> Result<Self> {
        let ids = ids.indices(ids_layout, "index_select", dim, layout.dims()[dim])?;
        Ok(match_storage!(self, v => Self::from_vec(index::index_select(v, layout, &ids, dim))))
    }

    fn gather(&self, layout: &Layout, ids: &Self, ids_layout: &Layout, dim: usize) -> Result<Self> {
        let idx = ids.indices(ids_layout, "gather", dim, layout.dims()[dim])?;
        Ok(
            match_storage!(self, v => Self::from_vec(index::gather(v, layout, &idx, ids_layout.shape(), dim))),
        )
    }

    fn scatter_add(
        &self,
        layout: &Layout,
        ids: &Self,
        il: &Layout,
        src: &Self,
        sl: &Layout,
        dim: usize,
    ) -> Result<Self> {
        let idx = ids.indices(il, "scatter_add", dim, layout.dims()[dim])?;
        let mut out = self.copy_contiguous(layout)?;
        let out_layout = Layout::contiguous(layout.shape().clone());
        match_same_dtype!("scatter_add", (&mut out, src), (o, s) => index::scatter_add(o, &out_layout, &idx, s, sl, dim));
        Ok(out)
    }

    fn cross_entropy(
        &self,
        layout: &Layout,
        targets: &Self,
        targets_layout: &Layout,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<Self>> {
        let labels = targets.indices(targets_layout, "cross_entropy", 1, layout.dims()[1])?;
        match_float_int!(self, v =>
            float: {
                let (loss, grad, correct) =
                    fused::cross_entropy(v, layout, &labels, smoothing, scale);
                Ok(CrossEntropyRows {
                    loss: Self::from_vec(loss),
                    grad: Self::from_vec(grad),
                    correct: Self::from_vec(correct),
                })
            },
            int: Err(Error::UnsupportedDType { op: "cross_entropy", dtype: self.dtype() }))
    }

    fn update_group(
        slots: &mut [crate::backend::UpdateSlot<'_, Self>],
        rule: UpdateRule,
        schedule: Option<&Self>,
    ) -> Result<()> {
        let rule = match schedule {
            Some(CpuStorage::F64(s)) if s.len() >= 2 => rule.with_schedule(s[0], s[1]),
            Some(s) => {
                return Err(Error::Msg(format!(
                    "{}: the schedule must be f64 [lr, step], got {} elements of {}",
                    rule.name(),
                    s.len(),
                    s.dtype()
                )))
            }
            None => rule,
        };
        for s in slots.iter_mut() {
            s.param
                .update(s.layout, s.grad, s.grad_layout, &mut s.state, rule)?;
        }
        Ok(())
    }

    fn update(
        &mut self,
        layout: &Layout,
        grad: &Self,
        grad_layout: &Layout,
        state: &mut [(&mut Self, &Layout)],
        rule: UpdateRule,
    ) -> Result<()> {
        fn run<T: elem::FloatElem>(p: &mut [T], g: &[T], state: Vec<&mut [T]>, rule: UpdateRule) {
            let mut state = state;
            fused::update(p, g, &mut state, rule)
        }
        let n = layout.elem_count();
        let (po, go) = (layout.offset(), grad_layout.offset());
        macro_rules! typed {
            ($variant:ident) => {{
                let CpuStorage::$variant(g) = grad else {
                    return Err(Error::DTypeMismatch {
                        op: rule.name(),
                        lhs: self.dtype(),
                        rhs: grad.dtype(),
                    });
                };
                let mut bufs = Vec::with_capacity(state.len());
                for (s, l) in state.iter_mut() {
                    let dtype = s.dtype();
                    let CpuStorage::$variant(v) = &mut **s else {
                        return Err(Error::DTypeMismatch {
                            op: rule.name(),
                            lhs: self.dtype(),
                            rhs: dtype,
                        });
                    };
                    bufs.push(&mut v[l.offset()..l.offset() + n]);
                }
                let CpuStorage::$variant(p) = self else {
                    unreachable!()
                };
                run(&mut p[po..po + n], &g[go..go + n], bufs, rule);
                Ok(())
            }};
        }
        match self.dtype() {
            DType::F16 => typed!(F16),
            DType::BF16 => typed!(BF16),
            DType::F32 => typed!(F32),
            DType::F64 => typed!(F64),
            dtype => Err(Error::UnsupportedDType {
                op: rule.name(),
                dtype,
            }),
        }
    }
}

/// The elements of `v` at `layout`, in a new contiguous vector. A contiguous source is
/// copied with `memcpy` over the output's halves (the second through the hot helper) or
/// per-thread chunks, as the element-wise maps split their work; the per-element rayon split
/// used before read 16 MiB at 28–45 GB/s where PyTorch's clone read 46–99 (2-core EPYC, the
/// data in L3, 2026-11-27).
fn copied<T: WithDType>(v: &[T], layout: &Layout) -> Vec<T> {
    if layout.contiguous_range().is_none() {
        return strided::copied(v, layout, T::ZERO);
    }
    chunked::map_kernel1(v, layout, 1, |src, dst| {
        // SAFETY: the driver hands the kernel a run of the source and the output chunk it
        // fills, of one length; `T: Copy`, and the output is a fresh allocation, so the two
        // do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<T>(), src.len())
        }
    })
}
