//! Dropout masks drawn on the device, from a step counter that lives in device memory.

use super::Tensor;
use crate::backend::BackendStorage;
use crate::op::DropoutDraw;
use crate::{DType, Device, Error, Result, Shape, WithDType};

/// A stream of dropout masks: a seed, and a step counter (an i64 tensor on the masks'
/// device) that every mask advances, on the device.
///
/// Element `i` of the mask of step `s` is a hash of (seed, `s`, `i`): the same masks on every
/// device from the same seed. On CUDA the kernel reads the step from device memory and an
/// in-place add advances it, so a step recorded in a CUDA graph draws a new mask on every
/// replay with nothing updated from the host; other backends read the step and build the
/// mask on the host.
///
/// ```
/// use kiln::{DType, Device, DropoutStream};
/// let stream = DropoutStream::new(7, &Device::Cpu)?;
/// let a = stream.mask([4, 1000], DType::F32, 0.25)?.to_vec::<f32>()?;
/// let b = stream.mask([4, 1000], DType::F32, 0.25)?.to_vec::<f32>()?;
/// assert_ne!(a, b); // each mask is a new step
/// assert!(a.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
/// let kept = a.iter().filter(|&&v| v != 0.0).count();
/// assert!((2800..3200).contains(&kept), "{kept} kept");
/// assert_eq!(stream.step()?, 2);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct DropoutStream {
    seed: u64,
    /// The next step: i64 `[1]` on the stream's device.
    step: Tensor,
    /// The constant 1 that advances `step` (kept, so that advancing allocates nothing).
    one: Tensor,
}

impl DropoutStream {
    /// A stream at step 0 on `device`.
    pub fn new(seed: u64, device: &Device) -> Result<DropoutStream> {
        DropoutStream::at_step(seed, 0, device)
    }

    /// A stream whose next mask is that of step `step` (to continue a stream on another
    /// device, or after a checkpoint).
    pub fn at_step(seed: u64, step: u64, device: &Device) -> Result<DropoutStream> {
        Ok(DropoutStream {
            seed,
            step: Tensor::from_vec(vec![step as i64], 1, device)?,
            one: Tensor::from_vec(vec![1i64], 1, device)?,
        })
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn device(&self) -> Device {
        self.step.device()
    }

    /// The step of the next mask, read back to the host (a synchronisation on a GPU).
    pub fn step(&self) -> Result<u64> {
        Ok(self.step.to_vec::<i64>()?[0] as u64)
    }

    /// The next mask, of `shape` and the float `dtype`: `1 / (1 - p)` with probability
    /// `1 - p`, 0 otherwise (in steps of 2^-24 of probability); advances the step.
    ///
    /// # Errors
    /// `p` outside `[0, 1)`, or a `dtype` that is not a float.
    pub fn mask(&self, shape: impl Into<Shape>, dtype: DType, p: f64) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Msg(format!(
                "dropout: p = {p} is out of range: [0, 1)"
            )));
        }
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: "dropout",
                dtype,
            });
        }
        let shape = shape.into();
        let n = shape.elem_count();
        let draw = DropoutDraw::new(self.seed, p);
        let drawn = self
            .step
            .storage()
            .dropout_mask(&self.step.layout, n, dtype, &draw)?;
        let mask = match drawn {
            Some(s) => Tensor::from_storage(s, shape),
            None => {
                let key = draw.key(self.step()?);
                let dev = self.device();
                match dtype {
                    DType::F16 => {
                        Tensor::from_vec(host_mask::<half::f16>(n, &draw, key), shape, &dev)
                    }
                    DType::BF16 => {
                        Tensor::from_vec(host_mask::<half::bf16>(n, &draw, key), shape, &dev)
                    }
                    DType::F32 => Tensor::from_vec(host_mask::<f32>(n, &draw, key), shape, &dev),
                    _ => Tensor::from_vec(host_mask::<f64>(n, &draw, key), shape, &dev),
                }?
            }
        };
        self.step.add_assign(&self.one)?;
        Ok(mask)
    }
}

fn host_mask<T: WithDType>(n: usize, draw: &DropoutDraw, key: u64) -> Vec<T> {
    let (keep, drop) = (T::from_f64(draw.scale), T::from_f64(0.0));
    (0..n as u64)
        .map(|i| if draw.keeps(key, i) { keep } else { drop })
        .collect()
}

impl Tensor {
    /// Dropout: `self` times the next mask of `stream` (see [`DropoutStream::mask`]), each
    /// element zeroed with probability `p` and the rest scaled by `1 / (1 - p)`. The
    /// gradient is the output gradient times the same mask. `p = 0` is the identity (no
    /// mask drawn).
    ///
    /// ```
    /// use kiln::{DType, Device, DropoutStream, Tensor};
    /// let x = Tensor::ones([2, 3], DType::F32, &Device::Cpu)?;
    /// let y = x.dropout(0.5, &DropoutStream::new(0, &Device::Cpu)?)?;
    /// assert!(y.to_vec::<f32>()?.iter().all(|&v| v == 0.0 || v == 2.0));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn dropout(&self, p: f64, stream: &DropoutStream) -> Result<Tensor> {
        if p == 0.0 {
            return Ok(self.clone());
        }
        self.mul(&stream.mask(self.shape().clone(), self.dtype(), p)?)
    }
}
