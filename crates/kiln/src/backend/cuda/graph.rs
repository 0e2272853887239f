//! CUDA graphs: record everything a closure queues on a device's stream, then replay it with
//! one launch.
//!
//! While a capture runs, the device is in *capture mode*:
//! - allocations come from a pool private to the graph ([`GraphPool`]); a buffer freed during
//!   the capture goes back to that pool and is reused by later ops of the same capture, which
//!   is safe because a graph recorded from one stream runs its nodes in stream order;
//! - a buffer allocated before the capture and freed during it is kept by the graph (the
//!   graph may read it on every replay);
//! - whatever would make the host wait for the device, or cannot be recorded, is refused
//!   with [`Error::GraphCapture`]: host transfers, synchronisation, reading the error flag,
//!   compiling a kernel, timing events, ops on another device or from another thread, an
//!   allocation that needs the out-of-memory retry. The first refusal also fails the capture,
//!   even if the closure swallowed it, and the capture is then discarded.
//!
//! After the capture the pool's buffers stay reserved for the graph: the tensors the closure
//! returned keep pointing at them and every replay rewrites them. When the graph is dropped,
//! its free buffers go back to the device's pool, and buffers still held by tensors follow
//! when those tensors are dropped.

use super::cuda_trace;
use super::device::CudaDevice;
use crate::{Device, Error, Result};
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// The memory of one graph: buffers allocated while it was captured and buffers it adopted.
///
/// Invariant: while `alive`, every buffer of the pool is either held by a tensor or in
/// `free`; once the graph is dropped (`alive == false`) buffers go to the device's pool.
pub(crate) struct GraphPool {
    dev: Arc<CudaDevice>,
    inner: Mutex<PoolInner>,
}

struct PoolInner {
    alive: bool,
    /// Free buffers by size class.
    free: HashMap<usize, Vec<sys::CUdeviceptr>>,
    /// Bytes of every buffer the graph owns (held by tensors or free).
    bytes: usize,
}

impl GraphPool {
    fn new(dev: Arc<CudaDevice>) -> GraphPool {
        GraphPool {
            dev,
            inner: Mutex::new(PoolInner {
                alive: true,
                free: HashMap::new(),
                bytes: 0,
            }),
        }
    }

    /// A free buffer of size class `class`, if the pool has one.
    pub(crate) fn take(&self, class: usize) -> Option<sys::CUdeviceptr> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.free.get_mut(&class).and_then(Vec::pop)
    }

    /// Records that a buffer of `class` bytes now belongs to the graph.
    pub(crate) fn own(&self, class: usize) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes += class;
    }

    /// Takes back a buffer of the graph whose tensor was dropped.
    pub(crate) fn release(&self, ptr: sys::CUdeviceptr, class: usize) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.alive {
            inner.free.entry(class).or_default().push(ptr);
        } else {
            inner.bytes -= class;
            drop(inner);
            self.dev.free(ptr, class);
        }
    }

    /// Adopts a buffer allocated before the capture and freed during it.
    pub(crate) fn adopt(&self, ptr: sys::CUdeviceptr, class: usize) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.bytes += class;
        inner.free.entry(class).or_default().push(ptr);
    }

    /// Ends the graph's ownership: free buffers return to the device's pool now, the others
    /// when their tensors are dropped.
    fn retire(&self) {
        let free: Vec<(usize, Vec<sys::CUdeviceptr>)> = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.alive = false;
            let free: Vec<_> = inner.free.drain().collect();
            for (class, ptrs) in &free {
                inner.bytes -= class * ptrs.len();
            }
            free
        };
        for (class, ptrs) in free {
            for p in ptrs {
                self.dev.free(p, class);
            }
        }
    }

    fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

/// What a device records while one of its graphs is being captured.
pub(crate) struct CaptureState {
    pub thread: ThreadId,
    pub pool: Arc<GraphPool>,
    /// The first op refused during the capture (fails the capture).
    pub refused: Option<Error>,
    /// Whether a captured kernel may raise the device's error flag.
    pub arms_flag: bool,
    /// What the recorded work needs alive as long as the graph (the NCCL communicators of
    /// captured collectives: NCCL refuses to destroy a communicator while a graph that
    /// recorded it exists, so the graph must go first).
    pub keep_alive: Vec<Arc<dyn std::any::Any + Send + Sync>>,
}

impl CudaDevice {
    /// Refuses `op` when this device is being captured, with `reason`; the refusal also
    /// fails the capture.
    pub(crate) fn refuse_in_capture(&self, op: &str, reason: &str) -> Result<()> {
        if !self.capturing() {
            return Ok(());
        }
        let err = |op: &str| Error::GraphCapture {
            op: op.to_string(),
            device: self.device(),
            reason: reason.to_string(),
        };
        let mut cap = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = cap.as_mut() {
            if state.refused.is_none() {
                state.refused = Some(err(op));
            }
            return Err(err(op));
        }
        Ok(())
    }

    /// Checks that an op queued now on this device from this thread can be recorded: the
    /// thread is not capturing another device, and if this device is capturing, the op comes
    /// from the capturing thread.
    #[inline]
    pub(crate) fn check_capture(&self, op: &str) -> Result<()> {
        crate::backend::check_not_capturing_elsewhere(self.device(), op)?;
        if !self.capturing() {
            return Ok(());
        }
        let same_thread = self
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|s| s.thread == std::thread::current().id());
        if same_thread {
            Ok(())
        } else {
            Err(Error::GraphCapture {
                op: op.to_string(),
                device: self.device(),
                reason: "another thread is capturing a graph on this device; ops from other \
                         threads must wait until the capture ends"
                    .into(),
            })
        }
    }

    /// The capture's pool when this device is being captured.
    pub(crate) fn capture_pool(&self) -> Option<Arc<GraphPool>> {
        if !self.capturing() {
            return None;
        }
        self.capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.pool.clone())
    }

    /// `f` applied to the capture's state while this device is being captured; `None`
    /// otherwise.
    fn with_capture_state<R>(&self, f: impl FnOnce(&mut CaptureState) -> R) -> Option<R> {
        if !self.capturing() {
            return None;
        }
        self.capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .map(f)
    }

    /// Notes that a queued kernel may raise the error flag: the next read checks it (and a
    /// graph that recorded such a kernel arms the check on every replay).
    pub(crate) fn arm_flag(&self) {
        if self.with_capture_state(|s| s.arms_flag = true).is_none() {
            self.flag_armed
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// While this device is being captured, makes the graph keep `obj` alive until it is
    /// dropped (after its executable graph is destroyed); otherwise does nothing.
    pub(crate) fn keep_alive_while_recorded(&self, obj: Arc<dyn std::any::Any + Send + Sync>) {
        self.with_capture_state(|s| s.keep_alive.push(obj));
    }
}

/// A recorded sequence of a CUDA device's work, replayed with one launch.
///
/// Made by [`Graph::capture`]. The tensors the closure returned live in memory owned by the
/// graph; each [`Graph::replay`] recomputes them from the current contents of the tensors the
/// closure read. Feed new inputs by writing into tensors made before the capture
/// ([`crate::Tensor::assign`]), and keep every tensor the graph reads alive while it is
/// replayed.
///
/// ```no_run
/// use kiln::{cuda::Graph, Device, DType, Tensor};
/// let dev = Device::Cuda(0);
/// let x = Tensor::zeros([4, 3], DType::F32, &dev)?; // the static input
/// let w = Tensor::ones([3, 2], DType::F32, &dev)?;
/// x.matmul(&w)?.relu()?; // run once eagerly: compiles the kernels, plans the GEMM
/// let (graph, y) = Graph::capture(&dev, || x.matmul(&w)?.relu())?;
/// for step in 0..3 {
///     x.assign(&Tensor::full(step as f64, [4, 3], DType::F32, &dev)?)?;
///     graph.replay()?;
///     println!("{:?}", y.to_vec::<f32>()?);
/// }
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct Graph {
    exec: sys::CUgraphExec,
    dev: Arc<CudaDevice>,
    pool: Arc<GraphPool>,
    arms_flag: bool,
    /// The kernel nodes' function names, in the driver's node order.
    kernel_names: Vec<String>,
    nodes: usize,
    /// Dropped after `exec` is destroyed (see `CaptureState::keep_alive`).
    keep_alive: Vec<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: the graph's handles are used only through `&self` methods that call the driver,
// which is thread-safe for launching one executable graph; `Graph` is not `Sync`, so no two
// threads use one graph at once.
unsafe impl Send for Graph {}

/// Ends a capture however the closure exits (error or panic): leaves capture mode, and
/// discards the partial graph.
struct CaptureGuard<'a> {
    dev: &'a Arc<CudaDevice>,
    ended: bool,
}

impl CaptureGuard<'_> {
    /// Ends the stream capture and leaves capture mode; returns the recorded graph (or why
    /// there is none) and the capture's state.
    fn end(&mut self) -> (Result<Option<sys::CUgraph>>, Option<CaptureState>) {
        self.ended = true;
        let _ = self.dev.bind();
        // SAFETY: the stream is this device's, in a capture begun by `Graph::capture`.
        let graph = unsafe { result::stream::end_capture(self.dev.stream.cu_stream()) }
            .map(|g| (!g.is_null()).then_some(g))
            .map_err(|e| Error::Cuda(format!("ending the graph capture: {e:?}")));
        let mut state = self
            .dev
            .capture
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.dev
            .capturing
            .store(false, std::sync::atomic::Ordering::Release);
        let elsewhere = crate::backend::take_refusal();
        if let Some(s) = state.as_mut() {
            if s.refused.is_none() {
                s.refused = elsewhere;
            }
        }
        crate::backend::set_capturing_on_this_thread(None);
        (graph, state)
    }
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let (graph, state) = self.end();
            if let Ok(Some(g)) = graph {
                // SAFETY: a graph returned by end_capture, destroyed once.
                let _ = unsafe { result::graph::destroy(g) };
            }
            if let Some(s) = state {
                s.pool.retire();
            }
        }
    }
}

impl Graph {
    /// Runs `f`, recording every op it queues on `device` into a graph instead of running
    /// it, and returns the graph with `f`'s result (whose tensors the graph owns).
    ///
    /// Run the same work once eagerly first: kernels are compiled and GEMM plans tuned on
    /// first use, which cannot happen inside a capture.
    ///
    /// # Threads
    /// The capture takes the device's one stream: while it runs, ops on this device from
    /// other threads are refused ([`Error::GraphCapture`]). Start it when no other thread is
    /// in the middle of an op on the device (an op that began before the capture, e.g. a
    /// GEMM plan timing its candidates, would otherwise fail along with the capture).
    ///
    /// # Errors
    /// `device` is not a CUDA device; `f` failed; `f` did something that cannot be recorded
    /// ([`Error::GraphCapture`]: a host transfer or read, a synchronisation, a kernel
    /// compile, an op on another device or from another thread, an allocation the pool cannot
    /// serve); or the driver could not instantiate the graph. The partial capture is then
    /// discarded and the device stays usable.
    pub fn capture<R>(device: &Device, f: impl FnOnce() -> Result<R>) -> Result<(Graph, R)> {
        let Device::Cuda(ordinal) = *device else {
            return Err(Error::Msg(format!(
                "Graph::capture: CUDA graphs need a CUDA device, got {device}"
            )));
        };
        if let Some(d) = crate::backend::capturing_on_this_thread() {
            return Err(Error::GraphCapture {
                op: "Graph::capture".into(),
                device: d,
                reason: "captures do not nest".into(),
            });
        }
        let dev = CudaDevice::get(ordinal)?;
        dev.bind()?;
        cuda_trace!("Graph::capture on {device}: begins");
        let pool = Arc::new(GraphPool::new(dev.clone()));
        {
            let mut cap = dev.capture.lock().unwrap_or_else(|e| e.into_inner());
            if cap.is_some() {
                return Err(Error::GraphCapture {
                    op: "Graph::capture".into(),
                    device: *device,
                    reason: "another thread is capturing a graph on this device".into(),
                });
            }
            // SAFETY: the device's own stream; relaxed mode lets the pool allocate while
            // capturing (kiln refuses the calls that would synchronise itself).
            unsafe {
                result::stream::begin_capture(
                    dev.stream.cu_stream(),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
            }
            .map_err(|e| Error::Cuda(format!("beginning a graph capture: {e:?}")))?;
            *cap = Some(CaptureState {
                thread: std::thread::current().id(),
                pool: pool.clone(),
                refused: None,
                arms_flag: false,
                keep_alive: Vec::new(),
            });
            dev.capturing
                .store(true, std::sync::atomic::Ordering::Release);
        }
        crate::backend::set_capturing_on_this_thread(Some(*device));
        let mut guard = CaptureGuard {
            dev: &dev,
            ended: false,
        };
        let out = f();
        let (graph, state) = guard.end();
        let state = state.expect("the capture state lives until the capture ends");
        let fail = |e: Error, graph: Option<sys::CUgraph>| {
            if let Some(g) = graph {
                // SAFETY: a graph returned by end_capture, destroyed once.
                let _ = unsafe { result::graph::destroy(g) };
            }
            state.pool.retire();
            Err(e)
        };
        let graph = match graph {
            Ok(g) => g,
            // A refused op (or the closure's own error) explains an invalidated capture
            // better than the driver's code does.
            Err(e) => return fail(state.refused.clone_err().or(out.err()).unwrap_or(e), None),
        };
        if let Some(e) = state.refused.clone_err() {
            return fail(e, graph);
        }
        let out = match out {
            Ok(o) => o,
            Err(e) => return fail(e, graph),
        };
        let Some(cu_graph) = graph else {
            return fail(
                Error::Cuda("the graph capture recorded nothing".into()),
                None,
            );
        };
        cuda_trace!("Graph::capture on {device}: ended, instantiating");
        let (kernel_names, nodes) = graph_nodes(cu_graph);
        // SAFETY: a complete graph from end_capture; instantiated once.
        let exec = match unsafe {
            result::graph::instantiate(
                cu_graph,
                // Nodes keep the priority of the stream they were captured from (only the
                // collectives' stream can differ: see `KILN_NCCL_PRIORITY`).
                sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY,
            )
        } {
            Ok(exec) => exec,
            Err(e) => {
                return fail(
                    Error::Cuda(format!("instantiating the captured graph: {e:?}")),
                    Some(cu_graph),
                )
            }
        };
        // SAFETY: the template is no longer needed once instantiated.
        let _ = unsafe { result::graph::destroy(cu_graph) };
        let graph = Graph {
            exec,
            dev: dev.clone(),
            pool: state.pool,
            arms_flag: state.arms_flag,
            kernel_names,
            nodes,
            keep_alive: state.keep_alive,
        };
        // SAFETY: uploads the instantiated graph to the device's stream.
        unsafe { result::graph::upload(graph.exec, dev.stream.cu_stream()) }
            .map_err(|e| Error::Cuda(format!("uploading the graph: {e:?}")))?;
        dev.note_bound();
        cuda_trace!("Graph::capture on {device}: uploaded");
        Ok((graph, out))
    }

    /// Queues one run of the recorded work on the device's stream (returns at once).
    pub fn replay(&self) -> Result<()> {
        self.dev.check_capture("Graph::replay")?;
        self.dev.bind()?;
        cuda_trace!("Graph::replay on {}", self.dev.device());
        // SAFETY: a live executable graph of this device, launched on its stream.
        unsafe { result::graph::launch(self.exec, self.dev.stream.cu_stream()) }
            .map_err(|e| Error::Cuda(format!("launching a graph: {e:?}")))?;
        super::note_launches(1);
        if self.arms_flag {
            self.dev
                .flag_armed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    pub fn device(&self) -> Device {
        self.dev.device()
    }

    /// Kernel nodes in the graph (each a kernel launch when run eagerly).
    pub fn kernel_count(&self) -> usize {
        self.kernel_names.len()
    }

    /// The function names of the graph's kernels (kiln's, and the libraries' such as
    /// cuBLASLt's GEMM kernels), `?` where the driver gives none: what a recorded step runs.
    pub fn kernel_names(&self) -> &[String] {
        &self.kernel_names
    }

    /// All nodes in the graph (kernels, copies, memsets).
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// Bytes of device memory the graph owns (its outputs and intermediates).
    pub fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Destroying the executable graph is safe while a replay is in flight (the driver
        // defers it); work queued after a replay reuses the memory only in stream order.
        let _ = self.dev.bind();
        // SAFETY: the executable graph was instantiated by `capture` and is destroyed once.
        let _ = unsafe { result::graph::exec_destroy(self.exec) };
        self.pool.retire();
        // Only now: a communicator's destruction waits for the graphs that recorded it.
        self.keep_alive.clear();
    }
}

/// (the kernel nodes' function names, all nodes) of a captured graph; a kernel whose name
/// the driver does not give is `?`.
fn graph_nodes(graph: sys::CUgraph) -> (Vec<String>, usize) {
    let mut n = 0usize;
    // SAFETY: a null array asks only for the count.
    if unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }
        .result()
        .is_err()
    {
        return (Vec::new(), 0);
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: the array holds `n` node handles.
    if unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }
        .result()
        .is_err()
    {
        return (Vec::new(), n);
    }
    let kernels = nodes
        .iter()
        .filter(|&&node| {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to `graph`; `ty` is valid for writes.
            unsafe { sys::cuGraphNodeGetType(node, &mut ty) }
                .result()
                .is_ok()
                && ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL
        })
        .map(|&node| kernel_name(node).unwrap_or_else(|| "?".into()))
        .collect();
    (kernels, n)
}

/// The function name of a kernel node (kiln's kernels by their CUfunction, library kernels
/// launched through the runtime by their CUkernel).
fn kernel_name(node: sys::CUgraphNode) -> Option<String> {
    // SAFETY: an all-zero parameter block (null pointers, zero sizes) is a valid value that
    // the driver overwrites.
    let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: `node` is a kernel node of a live graph; `params` is valid for writes.
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) }
        .result()
        .ok()?;
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the handles come from the driver; `name` is valid for writes.
    let found = if !params.func.is_null() {
        unsafe { sys::cuFuncGetName(&mut name, params.func) }
    } else if !params.kern.is_null() {
        unsafe { sys::cuKernelGetName(&mut name, params.kern) }
    } else {
        return None;
    };
    if found.result().is_err() || name.is_null() {
        return None;
    }
    // SAFETY: the driver returned a NUL-terminated name that lives as long as the function.
    Some(
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

trait CloneErr {
    fn clone_err(&self) -> Option<Error>;
}

impl CloneErr for Option<Error> {
    /// A copy of a refusal (errors are not `Clone`; refusals are always `GraphCapture`).
    fn clone_err(&self) -> Option<Error> {
        match self {
            Some(Error::GraphCapture { op, device, reason }) => Some(Error::GraphCapture {
                op: op.clone(),
                device: *device,
                reason: reason.clone(),
            }),
            Some(e) => Some(Error::Msg(e.to_string())),
            None => None,
        }
    }
}
