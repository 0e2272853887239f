//! [`Storage`]: the data of one tensor on one device. It forwards each primitive op to the
//! backend of its device, after checking that all operands live on that device.

use crate::backend::cpu::CpuStorage;
use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Result};

/// Device memory holding the elements a tensor's layout indexes into.
#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
}

impl Storage {
    /// Moves host data to `device`.
    pub(crate) fn from_cpu(cpu: CpuStorage, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu)),
            Device::Cuda(_) => Err(Error::DeviceUnavailable {
                device,
                reason: "this build of kiln has no CUDA backend yet".into(),
            }),
        }
    }

    /// A host copy of the elements at `layout`, contiguous.
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
        }
    }

    /// `n` elements equal to `value` on `device`.
    pub(crate) fn full(value: f64, n: usize, dtype: DType, device: Device) -> Result<Storage> {
        Storage::from_cpu(CpuStorage::full(value, n, dtype), device)
    }

    /// Two storages as one backend's type, or a device-mismatch error.
    fn pair<'a>(
        &'a self,
        other: &'a Storage,
        _op: &'static str,
    ) -> Result<(&'a CpuStorage, &'a CpuStorage)> {
        match (self, other) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Ok((a, b)),
        }
    }
}

impl BackendStorage for Storage {
    fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
        }
    }

    fn device(&self) -> Device {
        match self {
            Storage::Cpu(s) => s.device(),
        }
    }

    fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Self> {
        match self {
            Storage::Cpu(s) => s.unary(l, op).map(Storage::Cpu),
        }
    }

    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self> {
        let (a, b) = self.pair(rhs, op.name())?;
        a.binary(l, b, rl, op).map(Storage::Cpu)
    }

    fn compare(&self, l: &Layout, rhs: &Self, rl: &Layout, op: CmpOp) -> Result<Self> {
        let (a, b) = self.pair(rhs, op.name())?;
        a.compare(l, b, rl, op).map(Storage::Cpu)
    }

    fn where_cond(&self, l: &Layout, t: &Self, tl: &Layout, f: &Self, fl: &Layout) -> Result<Self> {
        let (c, t) = self.pair(t, "where_cond")?;
        let (_, f) = self.pair(f, "where_cond")?;
        c.where_cond(l, t, tl, f, fl).map(Storage::Cpu)
    }

    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self> {
        match self {
            Storage::Cpu(s) => s.cast(l, dtype).map(Storage::Cpu),
        }
    }

    fn copy_contiguous(&self, l: &Layout) -> Result<Self> {
        match self {
            Storage::Cpu(s) => s.copy_contiguous(l).map(Storage::Cpu),
        }
    }

    fn copy_into(&self, l: &Layout, dst: &mut Self, dl: &Layout) -> Result<()> {
        match (self, dst) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a.copy_into(l, b, dl),
        }
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        match self {
            Storage::Cpu(s) => s.reduce(l, dims, op).map(Storage::Cpu),
        }
    }

    fn softmax(&self, l: &Layout, dim: usize, log: bool) -> Result<Self> {
        match self {
            Storage::Cpu(s) => s.softmax(l, dim, log).map(Storage::Cpu),
        }
    }

    fn matmul(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<Self> {
        let (a, b) = self.pair(rhs, "matmul")?;
        a.matmul(l, b, rl).map(Storage::Cpu)
    }

    fn index_select(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        let (a, i) = self.pair(ids, "index_select")?;
        a.index_select(l, i, il, dim).map(Storage::Cpu)
    }

    fn gather(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        let (a, i) = self.pair(ids, "gather")?;
        a.gather(l, i, il, dim).map(Storage::Cpu)
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
        let (a, i) = self.pair(ids, "scatter_add")?;
        let (_, s) = self.pair(src, "scatter_add")?;
        a.scatter_add(l, i, il, s, sl, dim).map(Storage::Cpu)
    }
}
