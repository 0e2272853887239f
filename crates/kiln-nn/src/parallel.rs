//! Data-parallel training: every rank of a [`ProcessGroup`] holds a replica of the model,
//! takes its share of each global batch, and the gradients are summed across ranks before
//! the (identical) optimizer step, so the replicas stay equal and the run computes what one
//! device would with the global batch.
//!
//! [`DataParallel::backward`] starts reducing a bucket of gradients (~25 MB by default) as
//! soon as its last gradient is final, while the backward pass goes on (on NCCL the
//! reductions run on a stream of their own); the buckets are launched in the same order on
//! every rank. [`Trainer::data_parallel`](crate::fit::Trainer::data_parallel) uses it.

use crate::Module;
use kiln::dist::{Pending, ProcessGroup, ReduceOp};
use kiln::{Error, Grads, Result, Tensor};
use std::collections::HashMap;

/// PyTorch DDP's default bucket size.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// The gradient reducer of one rank.
///
/// ```
/// use kiln::dist::{ProcessGroup, ReduceOp};
/// use kiln::{DType, Device, Generator, Tensor};
/// use kiln_nn::{init::Init, parallel::DataParallel, Linear, Module};
/// let groups = ProcessGroup::for_threads(&[Device::Cpu, Device::Cpu])?;
/// std::thread::scope(|s| {
///     for group in groups {
///         s.spawn(move || {
///             // Replicas may start different: rank 0's parameters are broadcast.
///             let mut rng = Generator::new(group.rank() as u64);
///             let dev = Device::Cpu;
///             let model = Linear::new(3, 2, true, Init::XavierUniform, DType::F32, &dev, &mut rng)?;
///             let dp = DataParallel::new(group, &model, ReduceOp::Mean, 1 << 20)?;
///             let x = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, &dev, &mut rng)?; // this rank's rows
///             let out = model.forward(&x)?;
///             let grads = dp.backward(&out, &out.ones_like()?)?; // averaged over both ranks
///             assert!(grads.get(&model.named_parameters()[0].1).is_some());
///             Ok::<(), kiln::Error>(())
///         });
///     }
/// });
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct DataParallel {
    group: ProcessGroup,
    op: ReduceOp,
    /// Leaf ids per bucket, buckets in launch order (the last parameters first: their
    /// gradients are final first).
    buckets: Vec<Vec<u64>>,
    /// Bucket of each parameter's leaf id.
    bucket_of: HashMap<u64, usize>,
}

impl DataParallel {
    /// Makes `model`'s replicas equal (rank 0's parameters and buffers broadcast to every
    /// rank) and plans buckets of about `bucket_bytes`. `op` combines the gradients: `Sum`
    /// when each rank's loss is already scaled by the global batch, `Mean` when it is a mean
    /// over the rank's own rows.
    ///
    /// # Errors
    /// A parameter that is not on the group's device, `bucket_bytes` of zero, a failed
    /// broadcast.
    pub fn new(
        group: ProcessGroup,
        model: &dyn Module,
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<DataParallel> {
        if bucket_bytes == 0 {
            return Err(Error::Msg(
                "DataParallel: bucket_bytes = 0; a bucket needs at least one byte".into(),
            ));
        }
        let params = model.named_parameters();
        for (name, p) in params.iter().chain(model.named_buffers().iter()) {
            if p.device() != group.device() {
                return Err(Error::Msg(format!(
                    "DataParallel: {name} is on {}, rank {} of the group is on {}",
                    p.device(),
                    group.rank(),
                    group.device()
                )));
            }
            group.broadcast(p, 0)?;
        }
        let mut buckets: Vec<Vec<u64>> = Vec::new();
        let mut bytes = 0;
        for (name, p) in params.iter().rev() {
            let id = p.leaf_id().ok_or_else(|| {
                Error::Msg(format!(
                    "DataParallel: parameter {name} is not a leaf made by var()"
                ))
            })?;
            let size = p.elem_count() * p.dtype().size_in_bytes();
            if buckets.is_empty() || (bytes + size > bucket_bytes && bytes > 0) {
                buckets.push(Vec::new());
                bytes = 0;
            }
            buckets.last_mut().expect("pushed").push(id);
            bytes += size;
        }
        let bucket_of = buckets
            .iter()
            .enumerate()
            .flat_map(|(b, ids)| ids.iter().map(move |&id| (id, b)))
            .collect();
        Ok(DataParallel {
            group,
            op,
            buckets,
            bucket_of,
        })
    }

    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// Makes every rank's buffers (a batch norm's running statistics) equal to rank 0's, in
    /// place. Each rank updates its buffers from its own slice of the batch, so they drift
    /// apart; PyTorch's DDP broadcasts rank 0's before every forward, so its replicas hold
    /// rank 0's statistics, which this gives too. The trainer calls it at the end of each
    /// epoch, before evaluation and checkpoints. A collective: every rank must call it.
    pub fn sync_buffers(&self, model: &dyn Module) -> Result<()> {
        for (_, b) in model.named_buffers() {
            self.group.broadcast(&b, 0)?;
        }
        Ok(())
    }

    /// How the parameters were split into buckets (parameter counts, in launch order).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.buckets.iter().map(Vec::len).collect()
    }

    /// [`Tensor::backward_with`] from `out` seeded with `grad`, with every parameter's
    /// gradient reduced across the ranks (buckets launched as they fill; the device's later
    /// work is ordered after them before this returns, without a host wait).
    pub fn backward(&self, out: &Tensor, grad: &Tensor) -> Result<Grads> {
        let mut filled: Vec<Vec<Tensor>> = vec![Vec::new(); self.buckets.len()];
        let mut launched: Vec<Pending> = Vec::with_capacity(self.buckets.len());
        let grads = out.backward_with_hook(grad, |id, g| {
            let Some(&b) = self.bucket_of.get(&id) else {
                return Ok(g); // not a parameter of the model
            };
            // Reduced in place, so it must be contiguous and nobody else's.
            let g = if g.is_contiguous() && g.owns_storage_alone() {
                g
            } else {
                g.copy()?
            };
            filled[b].push(g.clone());
            // Launch full buckets in order, so every rank issues the same sequence.
            while launched.len() < self.buckets.len()
                && filled[launched.len()].len() == self.buckets[launched.len()].len()
            {
                let next = launched.len();
                launched.push(self.group.all_reduce_start(&filled[next], self.op)?);
            }
            Ok(g)
        })?;
        // Buckets with parameters that got no gradient: reduce what they have, in order.
        for bucket in filled.iter().skip(launched.len()) {
            launched.push(self.group.all_reduce_start(bucket, self.op)?);
        }
        for p in launched {
            p.wait()?;
        }
        Ok(grads)
    }
}
