//! Collectives across devices and processes: a [`ProcessGroup`] is one rank's handle on a
//! group of ranks that all-reduce, broadcast, all-gather and reduce-scatter tensors.
//!
//! - CUDA devices communicate through NCCL (loaded at run time; see `kiln info`), on a
//!   stream of the communicator's own ordered with the device's stream, so collectives can
//!   overlap later work ([`ProcessGroup::all_reduce_start`]) and record into CUDA graphs.
//! - Ranks that are threads of one process on other devices (the CPU, wgpu) exchange
//!   tensors through host memory: the same API, so data-parallel code is tested anywhere.
//! - A group of one rank ([`ProcessGroup::single`]) communicates nothing.
//!
//! One process per GPU joins with [`ProcessGroup::from_env`] (torchrun's `RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, or `KILN_RENDEZVOUS_FILE`); one process
//! driving several GPUs makes a group per device with [`ProcessGroup::for_threads`] and
//! hands each to a thread. Both run the same collectives.
//!
//! ```
//! use kiln::dist::{ProcessGroup, ReduceOp};
//! use kiln::{Device, Tensor};
//! // Two ranks, one thread each (on the CPU here; on GPUs the same code runs over NCCL).
//! let groups = ProcessGroup::for_threads(&[Device::Cpu, Device::Cpu])?;
//! std::thread::scope(|s| {
//!     for g in groups {
//!         s.spawn(move || {
//!             let t = Tensor::from_vec(vec![g.rank() as f32 + 1.0; 3], 3, &Device::Cpu)?;
//!             g.all_reduce(&t, ReduceOp::Sum)?;
//!             assert_eq!(t.to_vec::<f32>()?, [3.0; 3]);
//!             Ok::<(), kiln::Error>(())
//!         });
//!     }
//! });
//! # Ok::<(), kiln::Error>(())
//! ```

mod local;
mod rendezvous;

pub use rendezvous::Rendezvous;

use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "cuda")]
use crate::backend::cuda::nccl;

/// How values from every rank are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size (float dtypes).
    Mean,
    Max,
    Min,
}

enum Backend {
    /// A group of one: nothing to exchange.
    Solo,
    /// Threads of this process, exchanging through host memory.
    Local(Arc<local::Exchange>),
    #[cfg(feature = "cuda")]
    Nccl(Arc<nccl::NcclComm>),
}

/// One rank's membership of a group of ranks (see the [module docs](self)).
///
/// Every rank must call the same collectives in the same order with tensors of the same
/// shape and dtype (NCCL cannot check this across processes: a mismatch hangs until the
/// timeout or corrupts the result). Dropping a rank's group tells the other local ranks it
/// left, so they fail instead of waiting for it.
pub struct ProcessGroup {
    rank: usize,
    world: usize,
    device: Device,
    backend: Backend,
    timeout: Duration,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(rank {} of {} on {}, {})",
            self.rank,
            self.world,
            self.device,
            self.backend_name()
        )
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Backend::Local(x) = &self.backend {
            x.leave(self.rank);
        }
    }
}

/// Seconds from an environment variable, or `default`.
fn env_seconds(name: &str, default: f64) -> Result<Duration> {
    match std::env::var(name) {
        Ok(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::msg(format!(
                "{name} = '{v}': expected a positive number of seconds"
            ))),
        },
        Err(_) => Ok(Duration::from_secs_f64(default)),
    }
}

/// How long a rank waits for its peers before it gives up (`KILN_COLLECTIVE_TIMEOUT`,
/// seconds; default 300).
fn collective_timeout() -> Result<Duration> {
    env_seconds("KILN_COLLECTIVE_TIMEOUT", 300.0)
}

impl ProcessGroup {
    /// A group of one rank on `device`: every collective leaves its tensors as they are.
    pub fn single(device: &Device) -> ProcessGroup {
        ProcessGroup {
            rank: 0,
            world: 1,
            device: *device,
            backend: Backend::Solo,
            timeout: Duration::from_secs(300),
        }
    }

    /// One group per device for ranks that are threads of this process, rank `i` on
    /// `devices[i]`: NCCL when every device is a distinct CUDA device (a one-rank NCCL
    /// communicator for a single GPU), host-memory exchange otherwise. Hand each group to
    /// its own thread.
    ///
    /// # Errors
    /// No devices, a device this build or machine lacks ([`Error::DeviceUnavailable`]), a
    /// CUDA device listed twice, or NCCL missing.
    pub fn for_threads(devices: &[Device]) -> Result<Vec<ProcessGroup>> {
        let world = devices.len();
        if world == 0 {
            return Err(Error::msg("ProcessGroup::for_threads: no devices given"));
        }
        let timeout = collective_timeout()?;
        // A device this build or machine lacks is refused now, not at the first collective.
        for d in devices {
            crate::storage::Storage::check_available(*d)?;
        }
        let all_cuda = devices.iter().all(|d| d.is_cuda());
        if all_cuda {
            #[cfg(feature = "cuda")]
            {
                let ordinals: Vec<usize> = devices
                    .iter()
                    .map(|d| match d {
                        Device::Cuda(n) => *n,
                        _ => unreachable!("all CUDA"),
                    })
                    .collect();
                for (i, o) in ordinals.iter().enumerate() {
                    if ordinals[..i].contains(o) {
                        return Err(Error::msg(format!(
                            "ProcessGroup::for_threads: cuda:{o} is listed twice in {devices:?}; \
                             NCCL needs one rank per GPU"
                        )));
                    }
                }
                let comms = nccl::NcclComm::for_devices(&ordinals, timeout)?;
                return Ok(comms
                    .into_iter()
                    .zip(devices)
                    .enumerate()
                    .map(|(rank, (c, d))| ProcessGroup {
                        rank,
                        world,
                        device: *d,
                        backend: Backend::Nccl(Arc::new(c)),
                        timeout,
                    })
                    .collect());
            }
        }
        if world == 1 {
            return Ok(vec![ProcessGroup::single(&devices[0])]);
        }
        let exchange = Arc::new(local::Exchange::new(world, timeout));
        Ok(devices
            .iter()
            .enumerate()
            .map(|(rank, d)| ProcessGroup {
                rank,
                world,
                device: *d,
                backend: Backend::Local(exchange.clone()),
                timeout,
            })
            .collect())
    }

    /// Joins the group described by the environment, in the style of `torchrun`:
    /// `WORLD_SIZE` (default 1), `RANK`, and either `MASTER_ADDR`/`MASTER_PORT` (rank 0
    /// listens there and hands the others NCCL's id) or `KILN_RENDEZVOUS_FILE` (a path on a
    /// file system every rank sees; it must not exist when rank 0 starts).
    /// `KILN_RENDEZVOUS_TIMEOUT` bounds the wait for the other ranks (seconds, default 300).
    /// With `WORLD_SIZE` 1 (or unset) this is [`ProcessGroup::single`].
    ///
    /// # Errors
    /// Missing or malformed variables, a rank out of range, a device that is not CUDA when
    /// the world has more than one rank, NCCL missing, peers that do not arrive in time.
    pub fn from_env(device: &Device) -> Result<ProcessGroup> {
        let var = |name: &str| std::env::var(name).ok();
        let parse = |name: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| Error::msg(format!("{name} = '{v}': expected a whole number")))
        };
        let world = match var("WORLD_SIZE") {
            Some(v) => parse("WORLD_SIZE", v)?,
            None => 1,
        };
        if world == 0 {
            return Err(Error::msg(
                "WORLD_SIZE = 0: a group needs at least one rank",
            ));
        }
        if world == 1 {
            return Ok(ProcessGroup::single(device));
        }
        let rank = parse(
            "RANK",
            var("RANK")
                .ok_or_else(|| Error::msg(format!("WORLD_SIZE is {world} but RANK is not set")))?,
        )?;
        let rendezvous = Rendezvous::from_env()?;
        ProcessGroup::join(device, rank, world, &rendezvous)
    }

    /// Joins a group of `world` ranks, one per process, as `rank` on the CUDA `device`,
    /// meeting the others at `rendezvous`.
    ///
    /// # Errors
    /// As [`ProcessGroup::from_env`].
    // Without the `cuda` feature only the single-rank and CPU cases remain.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn join(
        device: &Device,
        rank: usize,
        world: usize,
        rendezvous: &Rendezvous,
    ) -> Result<ProcessGroup> {
        if rank >= world {
            return Err(Error::msg(format!(
                "ProcessGroup::join: rank {rank} is out of range for a world of {world} ranks"
            )));
        }
        if world == 1 {
            return Ok(ProcessGroup::single(device));
        }
        let timeout = collective_timeout()?;
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                // Rank 0 makes the id; the rendezvous hands it to the others.
                let mine = if rank == 0 {
                    Some(nccl::unique_id()?.0)
                } else {
                    None
                };
                let id = rendezvous.share(rank, world, mine)?;
                let comm =
                    nccl::NcclComm::join_rank(*ordinal, &nccl::RawId(id), rank, world, timeout)?;
                if rank == 0 {
                    rendezvous.finished();
                }
                Ok(ProcessGroup {
                    rank,
                    world,
                    device: *device,
                    backend: Backend::Nccl(Arc::new(comm)),
                    timeout,
                })
            }
            other => Err(Error::msg(format!(
                "ProcessGroup::join: rank {rank} of {world} is on {other}; groups of several \
                 processes communicate through NCCL and need CUDA devices (threads of one \
                 process can use any device: ProcessGroup::for_threads)"
            ))),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The device this rank's tensors live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// How long this rank waits for its peers in a collective or [`ProcessGroup::wait`]
    /// before it fails (default `KILN_COLLECTIVE_TIMEOUT` seconds, or 300).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        match &self.backend {
            Backend::Local(x) => x.set_timeout(timeout),
            #[cfg(feature = "cuda")]
            Backend::Nccl(c) => c.set_timeout(timeout),
            Backend::Solo => {}
        }
    }

    /// "nccl", "threads" or "single".
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Solo => "single",
            Backend::Local(_) => "threads",
            #[cfg(feature = "cuda")]
            Backend::Nccl(_) => "nccl",
        }
    }

    fn check(&self, op: &'static str, t: &Tensor) -> Result<()> {
        if t.device() != self.device {
            return Err(Error::DeviceMismatch {
                op,
                lhs: t.device(),
                rhs: self.device,
            });
        }
        Ok(())
    }

    /// Combines `t` across ranks with `op`; every rank's `t` then holds the result (in place,
    /// any layout).
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_start(std::slice::from_ref(t), op)?.wait()
    }

    /// Starts all-reducing `tensors` (in place, as one group of collectives) and returns at
    /// once: on NCCL the reduction runs on its own stream while the device goes on with
    /// later work; [`Pending::wait`] orders the device's later work after it. The tensors
    /// are kept alive until then. Contiguous tensors are reduced where they lie; others go
    /// through a contiguous copy written back at the wait.
    pub fn all_reduce_start(&self, tensors: &[Tensor], op: ReduceOp) -> Result<Pending> {
        for t in tensors {
            self.check("all_reduce", t)?;
            check_mean("all_reduce (Mean)", op, t)?;
        }
        match &self.backend {
            Backend::Solo => Ok(Pending::done()),
            Backend::Local(x) => {
                for t in tensors {
                    let all = x.exchange(self.rank, "all_reduce", t)?;
                    t.assign(&local::reduce(&all, op)?.to_device(&self.device)?)?;
                }
                Ok(Pending::done())
            }
            #[cfg(feature = "cuda")]
            Backend::Nccl(comm) => {
                let (work, write_back) = contiguous_parts(tensors)?;
                let calls = work
                    .iter()
                    .map(|t| {
                        let p = cuda_address(t)?;
                        Ok(nccl::Collective::AllReduce {
                            send: p,
                            recv: p,
                            count: t.elem_count(),
                            dtype: t.dtype(),
                            op: nccl_op(op),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                // SAFETY: each pointer addresses a contiguous tensor of `count` elements on
                // the communicator's device, kept alive by `Pending` until the join.
                unsafe { comm.launch("all_reduce", &calls, false)? };
                Ok(Pending {
                    comm: Some(comm.clone()),
                    keep: work,
                    write_back,
                })
            }
        }
    }

    /// Copies rank `root`'s `t` into every rank's `t` (in place).
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.check("broadcast", t)?;
        if root >= self.world {
            return Err(Error::msg(format!(
                "broadcast: root rank {root} is out of range for a world of {}",
                self.world
            )));
        }
        match &self.backend {
            Backend::Solo => Ok(()),
            Backend::Local(x) => {
                let all = x.exchange(self.rank, "broadcast", t)?;
                t.assign(&all[root].to_device(&self.device)?)
            }
            #[cfg(feature = "cuda")]
            Backend::Nccl(comm) => {
                let (work, write_back) = contiguous_parts(std::slice::from_ref(t))?;
                let p = cuda_address(&work[0])?;
                let call = nccl::Collective::Broadcast {
                    send: p,
                    recv: p,
                    count: t.elem_count(),
                    dtype: t.dtype(),
                    root,
                };
                // SAFETY: `p` addresses the contiguous tensor `work[0]`, alive until
                // `Pending` drops, after the join.
                unsafe { comm.launch("broadcast", &[call], false)? };
                Pending {
                    comm: Some(comm.clone()),
                    keep: work,
                    write_back,
                }
                .wait()
            }
        }
    }

    /// Every rank's `t` concatenated along dimension 0 in rank order (`[world·n, ...]` from
    /// `[n, ...]`; a scalar counts as `[1]`).
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.check("all_gather", t)?;
        let t = if t.rank() == 0 {
            t.reshape(1)?
        } else {
            t.clone()
        };
        let mut dims = t.dims().to_vec();
        dims[0] *= self.world;
        match &self.backend {
            Backend::Solo => t.copy(),
            Backend::Local(x) => {
                let all = x.exchange(self.rank, "all_gather", &t)?;
                let refs: Vec<&Tensor> = all.iter().collect();
                Tensor::cat(&refs, 0)?.to_device(&self.device)
            }
            #[cfg(feature = "cuda")]
            Backend::Nccl(comm) => {
                let src = t.contiguous()?;
                let out = Tensor::zeros(dims, t.dtype(), &self.device)?;
                let call = nccl::Collective::AllGather {
                    send: cuda_address(&src)?,
                    recv: cuda_address(&out)?,
                    count: src.elem_count(),
                    dtype: t.dtype(),
                };
                // SAFETY: `src` holds `count` elements and `out` `world × count`; the launch
                // joins the device's stream, so they outlive the collective.
                unsafe { comm.launch("all_gather", &[call], true)? };
                Ok(out)
            }
        }
    }

    /// The reduction of `t` across ranks, split along dimension 0 into `world` equal parts:
    /// rank `r` gets part `r` (`[n/world, ...]` from `[n, ...]`).
    ///
    /// # Errors
    /// When dimension 0 is not a multiple of the world size.
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.check("reduce_scatter", t)?;
        if t.rank() == 0 || !t.dims()[0].is_multiple_of(self.world) {
            return Err(Error::msg(format!(
                "reduce_scatter: shape {} does not split into {} equal parts along dimension 0",
                t.shape(),
                self.world
            )));
        }
        check_mean("reduce_scatter (Mean)", op, t)?;
        let part = t.dims()[0] / self.world;
        match &self.backend {
            Backend::Solo => t.copy(),
            Backend::Local(x) => {
                let all = x.exchange(self.rank, "reduce_scatter", t)?;
                local::reduce(&all, op)?
                    .narrow(0, self.rank * part, part)?
                    .to_device(&self.device)
            }
            #[cfg(feature = "cuda")]
            Backend::Nccl(comm) => {
                let src = t.contiguous()?;
                let mut dims = t.dims().to_vec();
                dims[0] = part;
                let out = Tensor::zeros(dims, t.dtype(), &self.device)?;
                let call = nccl::Collective::ReduceScatter {
                    send: cuda_address(&src)?,
                    recv: cuda_address(&out)?,
                    count: out.elem_count(),
                    dtype: t.dtype(),
                    op: nccl_op(op),
                };
                // SAFETY: `src` holds `world × count` elements and `out` `count`; the launch
                // joins the device's stream, so they outlive the collective.
                unsafe { comm.launch("reduce_scatter", &[call], true)? };
                Ok(out)
            }
        }
    }

    /// Returns when this rank's device has finished its queued work, collectives included,
    /// or fails within the collective timeout (`KILN_COLLECTIVE_TIMEOUT`, default 300 s)
    /// when a peer failed or stopped (on NCCL the communicator is then aborted, and every
    /// later collective on it is an error). Call it before reading results on the host
    /// where a hang would otherwise be possible (e.g. once per epoch).
    pub fn wait(&self) -> Result<()> {
        match &self.backend {
            #[cfg(feature = "cuda")]
            Backend::Nccl(comm) => comm.wait_idle(),
            _ => Ok(()),
        }
    }

    /// Returns when every rank has reached it (a one-element all-reduce, then [`wait`]).
    ///
    /// [`wait`]: ProcessGroup::wait
    pub fn barrier(&self) -> Result<()> {
        let t = Tensor::zeros(1, DType::F32, &self.device)?;
        self.all_reduce(&t, ReduceOp::Sum)?;
        self.wait()
    }
}

/// A mean is taken of float tensors only.
fn check_mean(name: &'static str, op: ReduceOp, t: &Tensor) -> Result<()> {
    if op == ReduceOp::Mean && !t.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: name,
            dtype: t.dtype(),
        });
    }
    Ok(())
}

/// Collectives started by [`ProcessGroup::all_reduce_start`]; [`Pending::wait`] (or drop)
/// orders the device's later work after them.
#[must_use = "call wait() before using the tensors"]
pub struct Pending {
    #[cfg(feature = "cuda")]
    comm: Option<Arc<nccl::NcclComm>>,
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    comm: Option<()>,
    /// The buffers the collectives read and write, alive until the join.
    keep: Vec<Tensor>,
    /// (caller's tensor, contiguous copy that was reduced) for non-contiguous inputs.
    write_back: Vec<(Tensor, Tensor)>,
}

impl Pending {
    fn done() -> Pending {
        Pending {
            comm: None,
            keep: Vec::new(),
            write_back: Vec::new(),
        }
    }

    /// Orders the device's later work after the collectives (no host wait) and writes
    /// reduced copies back into non-contiguous inputs.
    pub fn wait(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(comm) = self.comm.take() {
            comm.join("waiting for collectives")?;
        }
        for (dst, src) in std::mem::take(&mut self.write_back) {
            dst.assign(&src)?;
        }
        self.keep.clear();
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// The tensors to hand to NCCL (the inputs, or contiguous copies of non-contiguous ones)
/// and the (input, copy) pairs to write back after.
#[cfg(feature = "cuda")]
#[allow(clippy::type_complexity)]
fn contiguous_parts(tensors: &[Tensor]) -> Result<(Vec<Tensor>, Vec<(Tensor, Tensor)>)> {
    let mut work = Vec::with_capacity(tensors.len());
    let mut write_back = Vec::new();
    for t in tensors {
        if t.is_contiguous() {
            work.push(t.clone());
        } else {
            let c = t.copy()?;
            write_back.push((t.clone(), c.clone()));
            work.push(c);
        }
    }
    Ok((work, write_back))
}

/// The device address of a contiguous CUDA tensor's first element.
#[cfg(feature = "cuda")]
fn cuda_address(t: &Tensor) -> Result<cudarc::driver::sys::CUdeviceptr> {
    // The storage is only read on the host side: NCCL writes device memory through the
    // pointer, in stream order like any kernel.
    let s = t.storage();
    match &*s {
        crate::storage::Storage::Cuda(c) => Ok(nccl::address(c, t.layout().offset())),
        _ => Err(Error::msg(format!(
            "NCCL collective: the tensor is on {}, not a CUDA device",
            t.device()
        ))),
    }
}

#[cfg(feature = "cuda")]
fn nccl_op(op: ReduceOp) -> nccl::RedOp {
    match op {
        ReduceOp::Sum => nccl::RedOp::Sum,
        ReduceOp::Mean => nccl::RedOp::Avg,
        ReduceOp::Max => nccl::RedOp::Max,
        ReduceOp::Min => nccl::RedOp::Min,
    }
}

/// How collectives reach CUDA devices here, for `kiln info`.
pub fn nccl_status() -> String {
    #[cfg(feature = "cuda")]
    {
        match nccl::version() {
            Ok((v, path)) => format!("NCCL {v} ({path})"),
            Err(e) => format!("unavailable: {e}"),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        "NCCL unavailable: kiln was built without its `cuda` feature".into()
    }
}
