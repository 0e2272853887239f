//! Records of plain data: a slice of `#[repr(C)]` structs whose fields share one dtype is a
//! tensor of shape `[n, fields]`, in both directions without copying.

use crate::backend::cpu::CpuStorage;
use crate::storage::Storage;
use crate::{Error, Result, Tensor, WithDType};
use bytemuck::Pod;
use parking_lot::RwLockReadGuard;
use std::marker::PhantomData;

fn fields_of<R: Pod, T: WithDType>(op: &'static str) -> Result<usize> {
    let (rs, ts) = (std::mem::size_of::<R>(), std::mem::size_of::<T>());
    if rs == 0 || rs % ts != 0 || std::mem::align_of::<R>() != std::mem::align_of::<T>() {
        return Err(Error::Msg(format!(
            "{op}: a record of {rs} bytes (alignment {}) is not a whole number of {} fields (alignment {})",
            std::mem::align_of::<R>(),
            T::DTYPE,
            std::mem::align_of::<T>()
        )));
    }
    Ok(rs / ts)
}

impl Tensor {
    /// Takes a vector of records as a CPU tensor of shape `[n, fields]` with element type `T`,
    /// reusing its allocation (no copy). `R` must be made of `T` fields only, with `T`'s
    /// alignment.
    ///
    /// ```
    /// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    /// #[repr(C)]
    /// struct Point { x: f32, y: f32, z: f32 }
    /// let pts = vec![Point { x: 1., y: 2., z: 3. }, Point { x: 4., y: 5., z: 6. }];
    /// let t = kiln::Tensor::from_records::<Point, f32>(pts)?;
    /// assert_eq!(t.dims(), &[2, 3]);
    /// assert_eq!(t.records::<Point, f32>()?[1].y, 5.0);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn from_records<R: Pod, T: WithDType>(records: Vec<R>) -> Result<Tensor> {
        let fields = fields_of::<R, T>("from_records")?;
        let n = records.len();
        let elems: Vec<T> = bytemuck::allocation::try_cast_vec(records).map_err(|(e, _)| {
            Error::Msg(format!("from_records: cannot reuse the allocation: {e:?}"))
        })?;
        Ok(Tensor::from_storage(
            Storage::Cpu(CpuStorage::from_vec(elems)),
            [n, fields],
        ))
    }

    /// Borrows a contiguous CPU tensor of shape `[n, fields]` (element type `T`) as `n`
    /// records, without copying. The guard holds a read lock on the storage.
    pub fn records<R: Pod, T: WithDType>(&self) -> Result<Records<'_, R>> {
        let fields = fields_of::<R, T>("records")?;
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "records",
                lhs: self.dtype(),
                rhs: T::DTYPE,
            });
        }
        let range = self
            .layout()
            .contiguous_range()
            .filter(|_| self.rank() == 2 && self.dims()[1] == fields);
        let Some(range) = range else {
            return Err(Error::Msg(format!(
                "records: needs a contiguous [n, {fields}] tensor, got shape {} with strides {:?}",
                self.shape(),
                self.strides()
            )));
        };
        let guard = self.storage();
        if !self.device().is_cpu() {
            return Err(Error::DeviceMismatch {
                op: "records",
                lhs: self.device(),
                rhs: crate::Device::Cpu,
            });
        }
        Ok(Records {
            guard,
            range,
            _record: PhantomData,
        })
    }
}

/// A borrowed view of a tensor's rows as records; dereferences to `[R]`.
pub struct Records<'a, R> {
    guard: RwLockReadGuard<'a, Storage>,
    range: std::ops::Range<usize>,
    _record: PhantomData<R>,
}

impl<R: Pod> std::ops::Deref for Records<'_, R> {
    type Target = [R];
    fn deref(&self) -> &[R] {
        let cpu = match &*self.guard {
            Storage::Cpu(cpu) => cpu,
            #[allow(unreachable_patterns)]
            _ => unreachable!("records() only builds a guard for CPU tensors"),
        };
        let bytes: &[u8] = crate::backend::cpu::match_storage!(cpu, v => bytemuck::cast_slice(v));
        let elem = bytes.len() / cpu.len().max(1);
        bytemuck::cast_slice(&bytes[self.range.start * elem..self.range.end * elem])
    }
}
