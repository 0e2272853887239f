//! [`Storage`]: the data of one tensor on one device. It forwards each primitive op to the
//! backend of its device, after checking that all operands live on that device.

use crate::backend::cpu::CpuStorage;
#[cfg(feature = "cuda")]
use crate::backend::cuda::{CudaDevice, CudaStorage};
#[cfg(feature = "wgpu")]
use crate::backend::wgpu::WgpuStorage;
use crate::backend::{BackendStorage, UpdateSlot};
use crate::layout::Layout;
use crate::op::{
    BinaryOp, CmpOp, CrossEntropyRows, EpilogueActivation, ReduceOp, UnaryOp, UpdateRule,
};
use crate::{DType, Device, Error, Result};

/// Device memory holding the elements a tensor's layout indexes into.
#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(CudaStorage),
    #[cfg(feature = "wgpu")]
    Wgpu(WgpuStorage),
}

/// Runs `$body` with `$s` bound to the backend storage, whatever the device.
macro_rules! on_backend {
    ($storage:expr, $s:ident => $body:expr) => {
        match $storage {
            Storage::Cpu($s) => $body.map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            Storage::Cuda($s) => $body.map(Storage::Cuda),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu($s) => $body.map(Storage::Wgpu),
        }
    };
}

/// Runs `$body` with two storages of the same backend, or returns a device-mismatch error.
macro_rules! on_pair {
    ($op:expr, ($lhs:expr, $rhs:expr), ($a:ident, $b:ident) => $body:expr) => {
        match ($lhs, $rhs) {
            (Storage::Cpu($a), Storage::Cpu($b)) => $body.map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            (Storage::Cuda($a), Storage::Cuda($b)) => $body.map(Storage::Cuda),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu($a), Storage::Wgpu($b)) => $body.map(Storage::Wgpu),
            #[allow(unreachable_patterns)]
            (l, r) => Err(Error::DeviceMismatch {
                op: $op,
                lhs: l.device(),
                rhs: r.device(),
            }),
        }
    };
}

impl Device {
    /// Whether this device holds tensors of `dtype`: every dtype on the CPU and CUDA; on
    /// wgpu no f64 or bf16, and f16 only where the adapter has `SHADER_F16`.
    ///
    /// ```
    /// use kiln::{DType, Device};
    /// assert!(Device::Cpu.supports(DType::F64));
    /// ```
    pub fn supports(&self, dtype: DType) -> bool {
        match *self {
            #[cfg(feature = "wgpu")]
            Device::Wgpu(n) => WgpuStorage::supports(n, dtype),
            _ => {
                let _ = dtype;
                true
            }
        }
    }
}

impl Storage {
    /// Refuses a CPU op while this thread captures a CUDA graph: it would run once, at
    /// capture, and never on a replay. (CUDA storage is checked by its backend.)
    #[inline]
    fn guard(&self, op: &str) -> Result<()> {
        match self {
            Storage::Cpu(_) => crate::backend::check_not_capturing_elsewhere(Device::Cpu, op),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Ok(()),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(_) => Ok(()),
        }
    }

    /// Ok where tensors can live on `device` in this build and on this machine; else
    /// [`Error::DeviceUnavailable`] (or the device's own error) saying why.
    pub(crate) fn check_available(device: Device) -> Result<()> {
        Storage::from_cpu(CpuStorage::F32(vec![0.0]), device).map(|_| ())
    }

    /// Moves host data to `device`.
    pub(crate) fn from_cpu(cpu: CpuStorage, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu)),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => Ok(Storage::Cuda(CudaStorage::from_cpu(
                &CudaDevice::get(n)?,
                &cpu,
            )?)),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(Error::DeviceUnavailable {
                device,
                reason: "kiln was built without its `cuda` feature".into(),
            }),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(n) => Ok(Storage::Wgpu(WgpuStorage::from_cpu(n, &cpu)?)),
            #[cfg(not(feature = "wgpu"))]
            Device::Wgpu(_) => Err(Error::DeviceUnavailable {
                device,
                reason: "kiln was built without its `wgpu` feature".into(),
            }),
        }
    }

    /// A copy of the elements at `layout` on `device`, contiguous. Host data goes to the
    /// device without an intermediate host copy when it is already contiguous.
    pub(crate) fn to_device(&self, layout: &Layout, device: Device) -> Result<Storage> {
        match (self, device) {
            #[cfg(feature = "cuda")]
            (Storage::Cpu(s), Device::Cuda(n)) => {
                let whole = layout.is_contiguous()
                    && layout.offset() == 0
                    && layout.elem_count() == s.len();
                let dev = CudaDevice::get(n)?;
                if whole {
                    Ok(Storage::Cuda(CudaStorage::from_cpu(&dev, s)?))
                } else {
                    Ok(Storage::Cuda(CudaStorage::from_cpu(
                        &dev,
                        &s.copy_contiguous(layout)?,
                    )?))
                }
            }
            _ => Storage::from_cpu(self.to_cpu(layout)?, device),
        }
    }

    /// A host copy of the elements at `layout`, contiguous (waits for queued device work).
    pub(crate) fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        match self {
            Storage::Cpu(s) => {
                if layout.is_contiguous() && layout.offset() == 0 && layout.elem_count() == s.len()
                {
                    Ok(s.clone())
                } else {
                    s.copy_contiguous(layout)
                }
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.to_cpu(layout),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(s) => s.to_cpu(layout),
        }
    }

    /// `n` elements equal to `value` on `device`.
    pub(crate) fn full(value: f64, n: usize, dtype: DType, device: Device) -> Result<Storage> {
        match device {
            #[cfg(feature = "wgpu")]
            Device::Wgpu(o) => Ok(Storage::Wgpu(WgpuStorage::full(o, value, n, dtype)?)),
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => Ok(Storage::Cuda(CudaStorage::full(
                &CudaDevice::get(o)?,
                value,
                n,
                dtype,
            )?)),
            _ => Storage::from_cpu(CpuStorage::full(value, n, dtype), device),
        }
    }
}

impl BackendStorage for Storage {
    fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.dtype(),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(s) => s.dtype(),
        }
    }

    fn device(&self) -> Device {
        match self {
            Storage::Cpu(s) => s.device(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.device(),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(s) => s.device(),
        }
    }

    fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Self> {
        self.guard(op.name())?;
        on_backend!(self, s => s.unary(l, op))
    }

    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self> {
        self.guard(op.name())?;
        on_pair!(op.name(), (self, rhs), (a, b) => a.binary(l, b, rl, op))
    }

    fn binary_assign(&mut self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<()> {
        self.guard(op.name())?;
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a.binary_assign(l, b, rl, op),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => a.binary_assign(l, b, rl, op),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(a), Storage::Wgpu(b)) => a.binary_assign(l, b, rl, op),
            #[allow(unreachable_patterns)]
            (a, b) => Err(Error::DeviceMismatch {
                op: op.name(),
                lhs: a.device(),
                rhs: b.device(),
            }),
        }
    }

    fn affine(
        &self,
        l: &Layout,
        scale: &Self,
        sl: &Layout,
        shift: &Self,
        hl: &Layout,
    ) -> Result<Self> {
        self.guard("affine")?;
        match (self, scale, shift) {
            (Storage::Cpu(x), Storage::Cpu(s), Storage::Cpu(h)) => {
                x.affine(l, s, sl, h, hl).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(s), Storage::Cuda(h)) => {
                x.affine(l, s, sl, h, hl).map(Storage::Cuda)
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(x), Storage::Wgpu(s), Storage::Wgpu(h)) => {
                x.affine(l, s, sl, h, hl).map(Storage::Wgpu)
            }
            #[allow(unreachable_patterns)]
            (x, s, h) => Err(Error::DeviceMismatch {
                op: "affine",
                lhs: x.device(),
                rhs: if s.device() != x.device() {
                    s.device()
                } else {
                    h.device()
                },
            }),
        }
    }

    fn matmul_bias_act(
        &self,
        l: &Layout,
        rhs: &Self,
        rl: &Layout,
        bias: &Self,
        bl: &Layout,
        act: EpilogueActivation,
    ) -> Result<(Self, Option<Self>)> {
        self.guard("matmul_bias_act")?;
        match (self, rhs, bias) {
            (Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(c)) => a
                .matmul_bias_act(l, b, rl, c, bl, act)
                .map(|(o, z)| (Storage::Cpu(o), z.map(Storage::Cpu))),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b), Storage::Cuda(c)) => a
                .matmul_bias_act(l, b, rl, c, bl, act)
                .map(|(o, z)| (Storage::Cuda(o), z.map(Storage::Cuda))),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(a), Storage::Wgpu(b), Storage::Wgpu(c)) => a
                .matmul_bias_act(l, b, rl, c, bl, act)
                .map(|(o, z)| (Storage::Wgpu(o), z.map(Storage::Wgpu))),
            #[allow(unreachable_patterns)]
            (a, b, c) => Err(Error::DeviceMismatch {
                op: "matmul_bias_act",
                lhs: a.device(),
                rhs: if b.device() != a.device() {
                    b.device()
                } else {
                    c.device()
                },
            }),
        }
    }

    fn compare(&self, l: &Layout, rhs: &Self, rl: &Layout, op: CmpOp) -> Result<Self> {
        self.guard(op.name())?;
        on_pair!(op.name(), (self, rhs), (a, b) => a.compare(l, b, rl, op))
    }

    fn where_cond(&self, l: &Layout, t: &Self, tl: &Layout, f: &Self, fl: &Layout) -> Result<Self> {
        self.guard("where_cond")?;
        match (self, t, f) {
            (Storage::Cpu(c), Storage::Cpu(t), Storage::Cpu(f)) => {
                c.where_cond(l, t, tl, f, fl).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(c), Storage::Cuda(t), Storage::Cuda(f)) => {
                c.where_cond(l, t, tl, f, fl).map(Storage::Cuda)
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(c), Storage::Wgpu(t), Storage::Wgpu(f)) => {
                c.where_cond(l, t, tl, f, fl).map(Storage::Wgpu)
            }
            #[allow(unreachable_patterns)]
            (c, t, _) => Err(Error::DeviceMismatch {
                op: "where_cond",
                lhs: c.device(),
                rhs: t.device(),
            }),
        }
    }

    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self> {
        self.guard("cast")?;
        on_backend!(self, s => s.cast(l, dtype))
    }

    fn copy_contiguous(&self, l: &Layout) -> Result<Self> {
        self.guard("copy_contiguous")?;
        on_backend!(self, s => s.copy_contiguous(l))
    }

    fn copy_into(&self, l: &Layout, dst: &mut Self, dl: &Layout) -> Result<()> {
        self.guard("copy_into")?;
        match (self, dst) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a.copy_into(l, b, dl),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => a.copy_into(l, b, dl),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(a), Storage::Wgpu(b)) => a.copy_into(l, b, dl),
            #[allow(unreachable_patterns)]
            (a, b) => Err(Error::DeviceMismatch {
                op: "copy_into",
                lhs: a.device(),
                rhs: b.device(),
            }),
        }
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        self.guard(op.name())?;
        on_backend!(self, s => s.reduce(l, dims, op))
    }

    fn softmax(&self, l: &Layout, dim: usize, log: bool) -> Result<Self> {
        self.guard("softmax")?;
        on_backend!(self, s => s.softmax(l, dim, log))
    }

    fn logsumexp(&self, l: &Layout, dim: usize) -> Option<Result<Self>> {
        if let Err(e) = self.guard("logsumexp") {
            return Some(Err(e));
        }
        match self {
            Storage::Cpu(s) => s.logsumexp(l, dim).map(|r| r.map(Storage::Cpu)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.logsumexp(l, dim).map(|r| r.map(Storage::Cuda)),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(s) => s.logsumexp(l, dim).map(|r| r.map(Storage::Wgpu)),
        }
    }

    fn matmul(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<Self> {
        self.guard("matmul")?;
        on_pair!("matmul", (self, rhs), (a, b) => a.matmul(l, b, rl))
    }

    fn matmul_bias(
        &self,
        l: &Layout,
        rhs: &Self,
        rl: &Layout,
        bias: &Self,
        bl: &Layout,
    ) -> Result<Self> {
        self.guard("matmul_bias")?;
        match (self, rhs, bias) {
            (Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(c)) => {
                a.matmul_bias(l, b, rl, c, bl).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b), Storage::Cuda(c)) => {
                a.matmul_bias(l, b, rl, c, bl).map(Storage::Cuda)
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(a), Storage::Wgpu(b), Storage::Wgpu(c)) => {
                a.matmul_bias(l, b, rl, c, bl).map(Storage::Wgpu)
            }
            #[allow(unreachable_patterns)]
            (a, b, c) => Err(Error::DeviceMismatch {
                op: "matmul_bias",
                lhs: a.device(),
                rhs: if a.device() != b.device() {
                    b.device()
                } else {
                    c.device()
                },
            }),
        }
    }

    fn matmul_row_sums(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<(Self, Self)> {
        self.guard("matmul_row_sums")?;
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a
                .matmul_row_sums(l, b, rl)
                .map(|(p, s)| (Storage::Cpu(p), Storage::Cpu(s))),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => a
                .matmul_row_sums(l, b, rl)
                .map(|(p, s)| (Storage::Cuda(p), Storage::Cuda(s))),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(a), Storage::Wgpu(b)) => a
                .matmul_row_sums(l, b, rl)
                .map(|(p, s)| (Storage::Wgpu(p), Storage::Wgpu(s))),
            #[allow(unreachable_patterns)]
            (a, b) => Err(Error::DeviceMismatch {
                op: "matmul_row_sums",
                lhs: a.device(),
                rhs: b.device(),
            }),
        }
    }

    fn index_select(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        self.guard("index_select")?;
        on_pair!("index_select", (self, ids), (a, i) => a.index_select(l, i, il, dim))
    }

    fn gather(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        self.guard("gather")?;
        on_pair!("gather", (self, ids), (a, i) => a.gather(l, i, il, dim))
    }

    fn scatter_add(
        &self,
        l: &Layout,
        ids: &Self,
        il: &Layout,
        src: &Self,
        sl: &Layout,
        dim: usize,
    ) -> Result<Self> {
        self.guard("scatter_add")?;
        match (self, ids, src) {
            (Storage::Cpu(a), Storage::Cpu(i), Storage::Cpu(s)) => {
                a.scatter_add(l, i, il, s, sl, dim).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(i), Storage::Cuda(s)) => {
                a.scatter_add(l, i, il, s, sl, dim).map(Storage::Cuda)
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(a), Storage::Wgpu(i), Storage::Wgpu(s)) => {
                a.scatter_add(l, i, il, s, sl, dim).map(Storage::Wgpu)
            }
            #[allow(unreachable_patterns)]
            (a, i, _) => Err(Error::DeviceMismatch {
                op: "scatter_add",
                lhs: a.device(),
                rhs: i.device(),
            }),
        }
    }

    fn cross_entropy(
        &self,
        l: &Layout,
        targets: &Self,
        tl: &Layout,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<Self>> {
        self.guard("cross_entropy")?;
        fn wrap<S>(r: CrossEntropyRows<S>, f: fn(S) -> Storage) -> CrossEntropyRows<Storage> {
            CrossEntropyRows {
                loss: f(r.loss),
                grad: f(r.grad),
                correct: f(r.correct),
            }
        }
        match (self, targets) {
            (Storage::Cpu(x), Storage::Cpu(t)) => x
                .cross_entropy(l, t, tl, smoothing, scale)
                .map(|r| wrap(r, Storage::Cpu)),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(t)) => x
                .cross_entropy(l, t, tl, smoothing, scale)
                .map(|r| wrap(r, Storage::Cuda)),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(x), Storage::Wgpu(t)) => x
                .cross_entropy(l, t, tl, smoothing, scale)
                .map(|r| wrap(r, Storage::Wgpu)),
            #[allow(unreachable_patterns)]
            (x, t) => Err(Error::DeviceMismatch {
                op: "cross_entropy",
                lhs: x.device(),
                rhs: t.device(),
            }),
        }
    }

    fn cross_entropy_accumulate(
        &self,
        l: &Layout,
        targets: &Self,
        tl: &Layout,
        smoothing: f64,
        scale: f64,
        sums: [(&mut Self, &Layout); 3],
    ) -> Result<Option<CrossEntropyRows<Self>>> {
        self.guard("cross_entropy")?;
        let _ = (l, tl, smoothing, scale);
        match (self, targets, sums) {
            // Only CUDA fuses the sums; elsewhere the caller runs the separate ops.
            #[cfg(feature = "cuda")]
            (
                Storage::Cuda(x),
                Storage::Cuda(t),
                [(Storage::Cuda(a), al), (Storage::Cuda(b), bl), (Storage::Cuda(c), cl)],
            ) => Ok(x
                .cross_entropy_accumulate(l, t, tl, smoothing, scale, [(a, al), (b, bl), (c, cl)])?
                .map(|r| CrossEntropyRows {
                    loss: Storage::Cuda(r.loss),
                    grad: Storage::Cuda(r.grad),
                    correct: Storage::Cuda(r.correct),
                })),
            _ => Ok(None),
        }
    }

    fn dropout_mask(
        &self,
        step_layout: &Layout,
        n: usize,
        dtype: DType,
        draw: &crate::op::DropoutDraw,
    ) -> Result<Option<Self>> {
        self.guard("dropout_mask")?;
        let _ = (step_layout, n, dtype, draw);
        match self {
            // Only CUDA draws on the device; elsewhere the caller builds the mask on the host.
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(s
                .dropout_mask(step_layout, n, dtype, draw)?
                .map(Storage::Cuda)),
            _ => Ok(None),
        }
    }

    fn update(
        &mut self,
        l: &Layout,
        grad: &Self,
        gl: &Layout,
        state: &mut [(&mut Self, &Layout)],
        rule: UpdateRule,
    ) -> Result<()> {
        self.guard(rule.name())?;
        let device = self.device();
        let mismatch = |other: Device| Error::DeviceMismatch {
            op: rule.name(),
            lhs: device,
            rhs: other,
        };
        match (self, grad) {
            (Storage::Cpu(p), Storage::Cpu(g)) => {
                let mut st = Vec::with_capacity(state.len());
                for (s, sl) in state.iter_mut() {
                    let d = s.device();
                    match &mut **s {
                        Storage::Cpu(s) => st.push((s, *sl)),
                        #[allow(unreachable_patterns)]
                        _ => return Err(mismatch(d)),
                    }
                }
                p.update(l, g, gl, &mut st, rule)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(p), Storage::Cuda(g)) => {
                let mut st = Vec::with_capacity(state.len());
                for (s, sl) in state.iter_mut() {
                    let d = s.device();
                    match &mut **s {
                        Storage::Cuda(s) => st.push((s, *sl)),
                        _ => return Err(mismatch(d)),
                    }
                }
                p.update(l, g, gl, &mut st, rule)
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(p), Storage::Wgpu(g)) => {
                let mut st = Vec::with_capacity(state.len());
                for (s, sl) in state.iter_mut() {
                    let d = s.device();
                    match &mut **s {
                        Storage::Wgpu(s) => st.push((s, *sl)),
                        _ => return Err(mismatch(d)),
                    }
                }
                p.update(l, g, gl, &mut st, rule)
            }
            #[allow(unreachable_patterns)]
            (_, g) => Err(mismatch(g.device())),
        }
    }

    fn update_group(
        slots: &mut [UpdateSlot<'_, Self>],
        rule: UpdateRule,
        schedule: Option<&Self>,
    ) -> Result<()> {
        /// The slots re-borrowed as one backend's storages, or the first foreign device.
        fn narrow<'s, S>(
            slots: &'s mut [UpdateSlot<'_, Storage>],
            pick: impl Fn(&mut Storage) -> Option<&mut S>,
            pick_ref: impl Fn(&Storage) -> Option<&S>,
        ) -> std::result::Result<Vec<UpdateSlot<'s, S>>, Device> {
            let mut out = Vec::with_capacity(slots.len());
            for s in slots.iter_mut() {
                let grad_device = s.grad.device();
                let param_device = s.param.device();
                let param = pick(s.param).ok_or(param_device)?;
                let grad = pick_ref(s.grad).ok_or(grad_device)?;
                let mut state = Vec::with_capacity(s.state.len());
                for (b, l) in s.state.iter_mut() {
                    let d = b.device();
                    state.push((pick(b).ok_or(d)?, *l));
                }
                out.push(UpdateSlot {
                    param,
                    layout: s.layout,
                    grad,
                    grad_layout: s.grad_layout,
                    state,
                });
            }
            Ok(out)
        }
        let Some(first) = slots.first() else {
            return Ok(());
        };
        let device = first.param.device();
        first.param.guard(rule.name())?;
        let mismatch = |other: Device| Error::DeviceMismatch {
            op: rule.name(),
            lhs: device,
            rhs: other,
        };
        match device {
            Device::Cpu => {
                let mut cpu = narrow(
                    slots,
                    |s| match s {
                        Storage::Cpu(c) => Some(c),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    },
                    |s| match s {
                        Storage::Cpu(c) => Some(c),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    },
                )
                .map_err(mismatch)?;
                let schedule = match schedule {
                    Some(Storage::Cpu(s)) => Some(s),
                    #[allow(unreachable_patterns)]
                    Some(other) => return Err(mismatch(other.device())),
                    None => None,
                };
                CpuStorage::update_group(&mut cpu, rule, schedule)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => {
                let mut cuda = narrow(
                    slots,
                    |s| match s {
                        Storage::Cuda(c) => Some(c),
                        _ => None,
                    },
                    |s| match s {
                        Storage::Cuda(c) => Some(c),
                        _ => None,
                    },
                )
                .map_err(mismatch)?;
                let schedule = match schedule {
                    Some(Storage::Cuda(s)) => Some(s),
                    Some(other) => return Err(mismatch(other.device())),
                    None => None,
                };
                CudaStorage::update_group(&mut cuda, rule, schedule)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(mismatch(device)),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => {
                let mut wgpu = narrow(
                    slots,
                    |s| match s {
                        Storage::Wgpu(c) => Some(c),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    },
                    |s| match s {
                        Storage::Wgpu(c) => Some(c),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    },
                )
                .map_err(mismatch)?;
                let schedule = match schedule {
                    Some(Storage::Wgpu(s)) => Some(s),
                    Some(other) => return Err(mismatch(other.device())),
                    None => None,
                };
                WgpuStorage::update_group(&mut wgpu, rule, schedule)
            }
            #[cfg(not(feature = "wgpu"))]
            Device::Wgpu(_) => Err(mismatch(device)),
        }
    }
}

mod sparse;
mod window;
