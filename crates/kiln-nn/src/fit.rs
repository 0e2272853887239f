//! One training epoch of a classifier: shuffled minibatches, fused cross-entropy, backward,
//! optimizer step, with the running loss and hit counts kept on the device (one host read
//! at the end of the epoch). `kiln train` and the `train` benchmark both use it.

use crate::data::DeviceData;
use crate::loss::cross_entropy_with_hits;
use crate::optim::Optimizer;
use crate::Module;
use kiln::{AllDims, Device, Generator, Result, Tensor};

/// What one epoch measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochStats {
    /// Full batches taken.
    pub steps: usize,
    /// Mean of the per-batch mean losses.
    pub loss: f64,
    /// Fraction of the training rows seen whose argmax was the label.
    pub accuracy: f64,
}

/// Trains `model` for one pass over `data` in shuffled batches of `batch` rows (full batches
/// only), calling `on_step` after each step. Returns after the device has finished the epoch.
///
/// ```
/// use kiln::{DType, Device, Generator, Tensor};
/// use kiln_nn::{data::DeviceData, fit::train_epoch, init::Init, optim::Sgd, Linear, Module};
/// let mut rng = Generator::new(0);
/// let x = Tensor::randn([64, 4], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)?;
/// // Labels: which of the first two features is larger.
/// let y = x.narrow(1, 0, 1)?.gt(&x.narrow(1, 1, 1)?)?.to_dtype(DType::I64)?.flatten_all()?;
/// let data = DeviceData { x, y };
/// let model = Linear::new(4, 2, true, Init::XavierUniform, DType::F32, &Device::Cpu, &mut rng)?;
/// let mut opt = Sgd::new(model.named_parameters(), 0.5, 0.9, false, 0.0)?;
/// let mut last = None;
/// for _ in 0..20 {
///     last = Some(train_epoch(&model, &mut opt, &data, 16, 0.0, &mut rng, || {})?);
/// }
/// assert!(last.unwrap().accuracy > 0.9);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn train_epoch(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    data: &DeviceData,
    batch: usize,
    label_smoothing: f64,
    rng: &mut Generator,
    mut on_step: impl FnMut(),
) -> Result<EpochStats> {
    let mut loss_sum: Option<Tensor> = None;
    let mut hit_sum: Option<Tensor> = None;
    let mut steps = 0;
    for b in data.shuffled_batches(batch, rng)? {
        let (x, y) = b?;
        let logits = model.forward(&x)?;
        // One fused kernel gives the loss, its gradient and the per-row hits.
        let ce = cross_entropy_with_hits(&logits, &y, label_smoothing)?;
        let grads = ce.loss.backward()?;
        opt.step(&grads)?;
        // Running sums stay on the device (hits per row position, summed at the end).
        let l = ce.loss.detach();
        loss_sum = Some(match loss_sum.take() {
            Some(s) => s.add(&l)?,
            None => l,
        });
        hit_sum = Some(match hit_sum.take() {
            Some(s) => s.add(&ce.hits)?,
            None => ce.hits,
        });
        steps += 1;
        on_step();
    }
    let read = |t: Option<Tensor>| -> Result<f64> {
        Ok(t.map(|t| {
            t.sum(AllDims, false)?
                .to_device(&Device::Cpu)?
                .to_f64_vec()
                .map(|v| v[0])
        })
        .transpose()?
        .unwrap_or(0.0))
    };
    let steps_f = steps.max(1) as f64;
    Ok(EpochStats {
        steps,
        loss: read(loss_sum)? / steps_f,
        accuracy: read(hit_sum)? / (steps_f * batch.max(1) as f64),
    })
}
