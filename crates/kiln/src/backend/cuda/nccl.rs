//! NCCL communicators for CUDA devices: the library is opened at run time (`libnccl.so.2` as
//! pip's `nvidia-nccl` ships it, then `libnccl.so`, or the file named by `KILN_NCCL_LIBRARY`),
//! so a build with the `cuda` feature runs where NCCL is missing and says why collectives
//! are unavailable. cudarc's `nccl` module looks only for the unversioned `libnccl.so`, which
//! pip's wheel lacks, hence the small function table here.
//!
//! Collectives run on a stream of the communicator's own, ordered after the work queued so
//! far on the device's stream (an event fork) and, unless the caller keeps a [`Pending`] to
//! overlap them with later work, ordered before what follows (an event join). Both stream
//! orderings record into CUDA graphs, so a step with collectives can be captured.

use super::cuda_trace;
use super::device::CudaDevice;
use super::CudaStorage;
use crate::{DType, Device, Error, Result};
use cudarc::driver::{sys, CudaEvent, CudaStream};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// NCCL's `ncclUniqueId`: the 128 bytes every rank needs to join one communicator.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawId(pub [u8; 128]);

type RawComm = *mut c_void;
const SUCCESS: c_int = 0;
const IN_PROGRESS: c_int = 7;

/// The reductions NCCL offers that kiln uses (`ncclRedOp_t` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedOp {
    Sum = 0,
    Max = 2,
    Min = 3,
    Avg = 4,
}

/// `ncclAllReduce`, `ncclBroadcast`, `ncclReduceScatter`: buffers, count, dtype, then a
/// reduction op or a root rank.
type RootOrOpFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    sys::CUstream,
) -> c_int;

/// The entry points kiln calls, resolved once from the library.
struct Api {
    _lib: libloading::Library,
    path: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut RawId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, RawId, c_int) -> c_int,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(RawComm) -> c_int,
    comm_destroy: unsafe extern "C" fn(RawComm) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(RawComm, *mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: unsafe extern "C" fn(RawComm) -> *const c_char,
    all_reduce: RootOrOpFn,
    broadcast: RootOrOpFn,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        RawComm,
        sys::CUstream,
    ) -> c_int,
    reduce_scatter: RootOrOpFn,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
}

/// The library's names, in the order tried.
fn candidates() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(p) = std::env::var("KILN_NCCL_LIBRARY") {
        names.push(p);
    }
    names.extend(["libnccl.so.2".to_string(), "libnccl.so".to_string()]);
    names
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|reason| Error::Collective {
            op: "loading NCCL".into(),
            reason: reason.clone(),
        })
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for name in candidates() {
        // SAFETY: opening NCCL runs its (side-effect free) library constructors only.
        let lib = match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{name} ({e})"));
                continue;
            }
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol's type is NCCL's documented C signature (nccl.h); the
                // pointer stays valid while `_lib` (kept in the table) is loaded.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{name} lacks {}: {e}", $name))?
            };
        }
        return Ok(Api {
            path: name.clone(),
            get_version: sym!("ncclGetVersion"),
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_rank: sym!("ncclCommInitRank"),
            comm_init_all: sym!("ncclCommInitAll"),
            comm_abort: sym!("ncclCommAbort"),
            comm_destroy: sym!("ncclCommDestroy"),
            comm_get_async_error: sym!("ncclCommGetAsyncError"),
            get_error_string: sym!("ncclGetErrorString"),
            get_last_error: sym!("ncclGetLastError"),
            all_reduce: sym!("ncclAllReduce"),
            broadcast: sym!("ncclBroadcast"),
            all_gather: sym!("ncclAllGather"),
            reduce_scatter: sym!("ncclReduceScatter"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            _lib: lib,
        });
    }
    Err(format!(
        "the NCCL library was not found (tried {}); pip's nvidia-nccl-cu13 puts libnccl.so.2 \
         under site-packages/nvidia/nccl/lib: add that folder to LD_LIBRARY_PATH or name the \
         file in KILN_NCCL_LIBRARY",
        tried.join(", ")
    ))
}

/// NCCL's version as "major.minor.patch" and the file it was loaded from.
pub(crate) fn version() -> Result<(String, String)> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    check(
        api,
        unsafe { (api.get_version)(&mut v) },
        "ncclGetVersion",
        None,
    )?;
    // NCCL ≥ 2.9 encodes major*10000 + minor*100 + patch.
    let v = v as i64;
    Ok((
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100),
        api.path.clone(),
    ))
}

fn check(api: &Api, status: c_int, what: &str, comm: Option<RawComm>) -> Result<()> {
    if status == SUCCESS {
        return Ok(());
    }
    // SAFETY: NCCL returns static strings (or a per-communicator buffer valid until its next
    // call, copied here at once).
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let mut reason = text(unsafe { (api.get_error_string)(status) });
    let last = text(unsafe { (api.get_last_error)(comm.unwrap_or(std::ptr::null_mut())) });
    if !last.is_empty() {
        reason = format!("{reason} ({last})");
    }
    Err(Error::Collective {
        op: what.into(),
        reason,
    })
}

/// A fresh NCCL unique id (rank 0 makes it and hands it to the others).
pub(crate) fn unique_id() -> Result<RawId> {
    let api = api()?;
    let mut id = RawId([0; 128]);
    // SAFETY: `id` is a valid out-pointer of NCCL's 128-byte id type.
    check(
        api,
        unsafe { (api.get_unique_id)(&mut id) },
        "ncclGetUniqueId",
        None,
    )?;
    Ok(id)
}

fn nccl_dtype(dtype: DType) -> c_int {
    match dtype {
        DType::U8 => 1,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// One rank of an NCCL communicator, on one CUDA device.
///
/// Invariant: `comm` is live until `Drop` (destroyed there) or until `aborted` is set (then
/// NCCL has freed it and it is never used again).
pub(crate) struct NcclComm {
    comm: RawComm,
    pub(crate) dev: Arc<CudaDevice>,
    /// The stream collectives run on, forked from and joined back to the device's stream.
    stream: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    aborted: AtomicBool,
    /// How long a wait (and the drop) gives the peers, in milliseconds.
    timeout_ms: AtomicU64,
    /// NCCL calls on one communicator must not interleave between threads.
    calls: Mutex<()>,
}

// SAFETY: the raw communicator is only used under `calls` (or after every user is gone, in
// Drop); the rest is thread-safe.
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl Drop for NcclComm {
    /// Waits (bounded) for the queued collectives, then destroys the communicator; when they
    /// cannot finish (a peer failed or left mid-step) it is aborted instead, so a failing
    /// rank never hangs in its cleanup.
    fn drop(&mut self) {
        if self.aborted.load(Ordering::Acquire) {
            return;
        }
        let Ok(api) = api() else { return };
        if self.wait_idle().is_err() {
            return; // aborted by the wait
        }
        // SAFETY: live communicator (see the invariant), destroyed once.
        unsafe {
            (api.comm_destroy)(self.comm);
        }
    }
}

impl NcclComm {
    fn wrap(
        comm: RawComm,
        dev: Arc<CudaDevice>,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<NcclComm> {
        let err = |what: &'static str| move |e| Error::Cuda(format!("{what}: {e:?}"));
        // `KILN_NCCL_PRIORITY=high`: collectives on a stream of the device's greatest
        // priority, so their blocks are scheduled ahead of queued GEMM blocks (graphs keep the
        // priority: they are instantiated with node priorities). A tuning knob, off by default:
        // on two H100s it moved the f32 MLP by noise only (343K against 339K samples/s).
        let stream = if std::env::var("KILN_NCCL_PRIORITY").is_ok_and(|v| v == "high") {
            let (_, greatest) = cudarc::driver::result::stream::get_priority_range()
                .map_err(err("reading the stream priority range"))?;
            dev.ctx.new_stream_with_priority(greatest)
        } else {
            dev.ctx.new_stream()
        }
        .map_err(err("creating the NCCL stream"))?;
        let fork = dev.ctx.new_event(None).map_err(err("creating an event"))?;
        let join = dev.ctx.new_event(None).map_err(err("creating an event"))?;
        dev.note_bound();
        Ok(NcclComm {
            comm,
            dev,
            stream,
            fork,
            join,
            rank,
            world,
            aborted: AtomicBool::new(false),
            timeout_ms: AtomicU64::new(timeout.as_millis() as u64),
            calls: Mutex::new(()),
        })
    }

    /// Joins the communicator `id` as `rank` of `world` on `device` (blocks until every rank
    /// has joined).
    pub(crate) fn join_rank(
        device: usize,
        id: &RawId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<NcclComm> {
        let api = api()?;
        let dev = CudaDevice::get(device)?;
        dev.bind()?;
        let mut comm: RawComm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the device's context is current, which is
        // how NCCL picks the GPU.
        let status = unsafe { (api.comm_init_rank)(&mut comm, world as c_int, *id, rank as c_int) };
        check(
            api,
            status,
            &format!("ncclCommInitRank (rank {rank} of {world} on cuda:{device})"),
            None,
        )?;
        NcclComm::wrap(comm, dev, rank, world, timeout)
    }

    /// One communicator over `devices` (rank i on `devices[i]`), for one process driving them
    /// all from a thread each.
    pub(crate) fn for_devices(devices: &[usize], timeout: Duration) -> Result<Vec<NcclComm>> {
        let api = api()?;
        let devs = devices
            .iter()
            .map(|&d| CudaDevice::get(d))
            .collect::<Result<Vec<_>>>()?;
        let list: Vec<c_int> = devices.iter().map(|&d| d as c_int).collect();
        let mut comms: Vec<RawComm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        let status =
            unsafe { (api.comm_init_all)(comms.as_mut_ptr(), list.len() as c_int, list.as_ptr()) };
        check(
            api,
            status,
            &format!("ncclCommInitAll over cuda devices {devices:?}"),
            None,
        )?;
        let world = devices.len();
        comms
            .into_iter()
            .zip(devs)
            .enumerate()
            .map(|(rank, (c, dev))| NcclComm::wrap(c, dev, rank, world, timeout))
            .collect()
    }

    pub(crate) fn device(&self) -> Device {
        self.dev.device()
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    fn live(&self, op: &str) -> Result<&'static Api> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::Collective {
                op: op.into(),
                reason: format!(
                    "rank {} of {}: the communicator was aborted after an earlier failure",
                    self.rank, self.world
                ),
            });
        }
        api()
    }

    /// Queues `calls` (each one NCCL collective on the communicator's stream, in one NCCL
    /// group) after the work on the device's stream. With `join`, the device's stream then
    /// waits for them; otherwise the caller must call [`NcclComm::join`] before it reuses or
    /// frees the buffers.
    ///
    /// # Safety
    /// Each call's pointers must address live device memory of this device, large enough
    /// for its counts, and stay so until the collectives finish (the join).
    pub(crate) unsafe fn launch(
        self: &Arc<Self>,
        op: &str,
        calls: &[Collective],
        join: bool,
    ) -> Result<()> {
        let api = self.live(op)?;
        // A graph that records collectives must be destroyed before the communicator.
        self.dev.keep_alive_while_recorded(self.clone());
        let _calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        cuda_trace!(
            "{op}: {} collective(s) on rank {} of {} ({}, capturing: {}, join: {join})",
            calls.len(),
            self.rank,
            self.world,
            self.device(),
            self.dev.capturing()
        );
        self.dev.bind()?;
        let cuda = |what: &'static str| move |e| Error::Cuda(format!("{op}: {what}: {e:?}"));
        self.fork
            .record(&self.dev.stream)
            .map_err(cuda("recording the fork event"))?;
        self.stream
            .wait(&self.fork)
            .map_err(cuda("waiting on the fork event"))?;
        let s = self.stream.cu_stream();
        let what = format!("{op} (rank {} of {})", self.rank, self.world);
        // SAFETY: group calls bracket the collectives; the pointers are the caller's promise.
        unsafe {
            check(api, (api.group_start)(), &what, Some(self.comm))?;
            let mut first_err = Ok(());
            for c in calls {
                let status = match *c {
                    Collective::AllReduce {
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                    } => (api.all_reduce)(
                        send as _,
                        recv as _,
                        count,
                        nccl_dtype(dtype),
                        op as c_int,
                        self.comm,
                        s,
                    ),
                    Collective::Broadcast {
                        send,
                        recv,
                        count,
                        dtype,
                        root,
                    } => (api.broadcast)(
                        send as _,
                        recv as _,
                        count,
                        nccl_dtype(dtype),
                        root as c_int,
                        self.comm,
                        s,
                    ),
                    Collective::AllGather {
                        send,
                        recv,
                        count,
                        dtype,
                    } => (api.all_gather)(
                        send as _,
                        recv as _,
                        count,
                        nccl_dtype(dtype),
                        self.comm,
                        s,
                    ),
                    Collective::ReduceScatter {
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                    } => (api.reduce_scatter)(
                        send as _,
                        recv as _,
                        count,
                        nccl_dtype(dtype),
                        op as c_int,
                        self.comm,
                        s,
                    ),
                };
                if first_err.is_ok() {
                    first_err = check(api, status, &what, Some(self.comm));
                }
            }
            let end = check(api, (api.group_end)(), &what, Some(self.comm));
            first_err.and(end)?;
        }
        crate::backend::cuda::note_launches(1);
        if join {
            self.join_locked(op)?;
        }
        Ok(())
    }

    /// Makes the device's stream wait for every collective queued so far.
    pub(crate) fn join(&self, op: &str) -> Result<()> {
        let _calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        self.join_locked(op)
    }

    fn join_locked(&self, op: &str) -> Result<()> {
        let cuda = |what: &'static str| move |e| Error::Cuda(format!("{op}: {what}: {e:?}"));
        self.join
            .record(&self.stream)
            .map_err(cuda("recording the join event"))?;
        self.dev
            .stream
            .wait(&self.join)
            .map_err(cuda("waiting on the join event"))
    }

    /// Waits, for at most `timeout`, until the device has finished everything queued so far
    /// (collectives included), checking NCCL's asynchronous error state meanwhile. On a
    /// communicator error or a timeout (a peer that failed, stopped or never arrived) the
    /// communicator is aborted, which also stops this rank's collectives in flight, and the
    /// error says which; the device stays usable.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        let timeout = Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed));
        let api = self.live("waiting for collectives")?;
        if self.dev.capturing() {
            return Err(Error::GraphCapture {
                op: "waiting for collectives".into(),
                device: self.device(),
                reason: "waiting makes the host wait for the device".into(),
            });
        }
        let done = {
            let _calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            self.join_locked("waiting for collectives")?;
            self.dev
                .stream
                .record_event(None)
                .map_err(|e| Error::Cuda(format!("recording an event: {e:?}")))?
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        cuda_trace!(
            "wait_idle: rank {} of {} ({}) waits",
            self.rank,
            self.world,
            self.device()
        );
        loop {
            match done.try_is_complete() {
                Ok(true) => {
                    cuda_trace!(
                        "wait_idle: rank {} done after {:.3} ms",
                        self.rank,
                        start.elapsed().as_secs_f64() * 1e3
                    );
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => return Err(Error::Cuda(format!("waiting for collectives: {e:?}"))),
            }
            let mut state: c_int = SUCCESS;
            let _calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: live communicator; `state` is a valid out-pointer.
            check(
                api,
                unsafe { (api.comm_get_async_error)(self.comm, &mut state) },
                "ncclCommGetAsyncError",
                Some(self.comm),
            )?;
            let failed = state != SUCCESS && state != IN_PROGRESS;
            let late = start.elapsed() > timeout;
            if failed || late {
                let reason = if failed {
                    let mut r = check(api, state, "", Some(self.comm))
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    r.insert_str(0, "NCCL reported an error: ");
                    r
                } else {
                    format!(
                        "the collectives did not finish within {:.0} s (a peer rank failed, \
                         stopped or is far behind; KILN_COLLECTIVE_TIMEOUT sets the limit in \
                         seconds)",
                        timeout.as_secs_f64()
                    )
                };
                self.aborted.store(true, Ordering::Release);
                abort_in_background(api, self.comm, ABORT_GRACE);
                return Err(Error::Collective {
                    op: format!("rank {} of {} on {}", self.rank, self.world, self.device()),
                    reason,
                });
            }
            drop(_calls);
            std::thread::sleep(pause);
            // Short pauses while the wait is short (a step's or an epoch's tail: a long
            // pause would be added to it whole), longer ones once it is clearly long.
            if start.elapsed() > Duration::from_millis(50) {
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }
}

/// How long a failing wait lets the abort run before it reports the failure.
const ABORT_GRACE: Duration = Duration::from_secs(10);

/// Aborts `comm` on a thread of its own and waits up to `grace` for it to finish.
/// `ncclCommAbort` first raises the flag that stops the communicator's kernels in flight (so
/// the device's queue drains), then waits until every CUDA graph that recorded a collective
/// on it is destroyed, which may be later than the caller (who is told of the failure after
/// `grace` at most) or never; the caller never uses `comm` again.
///
/// The wait matters to a program that exits on the error it is handed: exiting while
/// another thread is inside `ncclCommAbort` races NCCL's teardown against the process's.
/// That is the likeliest cause of a failure seen once on two H100s (the surviving rank of a
/// dead peer printed its error, then did not exit cleanly). With no graph holding the
/// communicator the abort finishes well within the grace.
fn abort_in_background(api: &'static Api, comm: RawComm, grace: Duration) {
    struct Handle(RawComm);
    // SAFETY: NCCL communicators may be used from any thread; this one has no other user.
    unsafe impl Send for Handle {}
    let handle = Handle(comm);
    let (finished, done) = std::sync::mpsc::channel::<()>();
    let abort = move || {
        let handle = handle;
        // SAFETY: a live communicator, aborted once; its owner marked it aborted first.
        unsafe {
            (api.comm_abort)(handle.0);
        }
        let _ = finished.send(()); // the waiter may have stopped waiting
    };
    match std::thread::Builder::new()
        .name("kiln-nccl-abort".into())
        .spawn(abort)
    {
        Ok(_) => {
            if done.recv_timeout(grace).is_err() {
                cuda_trace!(
                    "abort: still waiting after {grace:?} (a graph holds the communicator)"
                );
            }
        }
        Err(_) => {
            // No thread to be had: abort here (this may wait for the graphs).
            // SAFETY: a live communicator, aborted once; the failed spawn never ran `abort`.
            unsafe {
                (api.comm_abort)(comm);
            }
        }
    }
}

/// One NCCL collective on device pointers (element counts, not bytes).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Collective {
    AllReduce {
        send: sys::CUdeviceptr,
        recv: sys::CUdeviceptr,
        count: usize,
        dtype: DType,
        op: RedOp,
    },
    Broadcast {
        send: sys::CUdeviceptr,
        recv: sys::CUdeviceptr,
        count: usize,
        dtype: DType,
        root: usize,
    },
    /// `count` elements from every rank, gathered in rank order into `recv`.
    AllGather {
        send: sys::CUdeviceptr,
        recv: sys::CUdeviceptr,
        count: usize,
        dtype: DType,
    },
    /// `count` elements of the reduction to each rank (`send` holds `count × world`).
    ReduceScatter {
        send: sys::CUdeviceptr,
        recv: sys::CUdeviceptr,
        count: usize,
        dtype: DType,
        op: RedOp,
    },
}

/// The device address of element `offset` of `s`.
pub(crate) fn address(s: &CudaStorage, offset: usize) -> sys::CUdeviceptr {
    s.buf.ptr + (offset * s.dtype.size_in_bytes()) as sys::CUdeviceptr
}
