//! Convolutions through cuDNN (loaded at run time; without it, or with `KILN_CUDNN=0`,
//! convolutions take the im2col + cuBLASLt path). Each problem (dtype, precision, shapes,
//! strides, window, direction) gets a plan once, measured on the call's own buffers (what
//! `torch.backends.cudnn.benchmark = True` does): the fastest algorithm of the legacy API's
//! `cudnnFind*AlgorithmEx` (`cudnn/legacy.rs`), timed beside the execution plans of the graph
//! API's heuristics (`cudnn_graph.rs`); the fastest of all runs the problem from then on.
//! `KILN_CUDNN_API=legacy` or `=graph` restricts the choice to one API (the GPU tests run
//! both). Workspaces come from the caching allocator.

use super::cudnn_choice::{
    api, candidates, log_choices, log_verbose, pick, timing, Among, Api, Timing,
};
use super::cudnn_graph::{self, GraphPlan};
use super::{CudaDevice, CudaStorage};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::{DType, Error, Result};
use cudarc::cudnn::sys as cs;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

mod legacy;

/// Why cuDNN is not used, or `None` when it is.
pub(crate) fn unavailable_reason() -> Option<&'static str> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| {
            if std::env::var("KILN_CUDNN").is_ok_and(|v| v == "0") {
                return Some("disabled by KILN_CUDNN=0".into());
            }
            // SAFETY: probes for the shared library without calling into it.
            if !unsafe { cs::is_culib_present() } {
                return Some(
                    "libcudnn (cuDNN 9) is not on the library path; add its lib/ folder to \
                     LD_LIBRARY_PATH (pip's nvidia-cudnn-cu13 installs it under \
                     site-packages/nvidia/cudnn/lib)"
                        .into(),
                );
            }
            let version = cudarc::cudnn::result::get_version();
            if version < 90000 {
                return Some(format!("cuDNN {version} is older than 9.0"));
            }
            None
        })
        .as_deref()
}

/// The loaded cuDNN version (e.g. 91002), when it is used.
pub(crate) fn version() -> Option<usize> {
    unavailable_reason()
        .is_none()
        .then(cudarc::cudnn::result::get_version)
}

/// The loaded cuDNN version as saved choices' files name it (`cudnn91400`, or `no-cudnn`):
/// every convolution choice is measured against cuDNN, so their files are per version.
pub(super) fn version_label() -> String {
    version().map_or("no-cudnn".into(), |v| format!("cudnn{v}"))
}

/// Which convolution a plan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx` from `dy` and `w`.
    BackwardData,
    /// `dw` from `x` and `dy`.
    BackwardFilter,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    dtype: DType,
    tf32: bool,
    /// Exact precision (f32 without TF32, f64) with FFT and Winograd algorithms left out
    /// ([`super::set_conv_transforms`] off).
    exact: bool,
    /// Nondeterministic algorithms left out ([`super::set_conv_deterministic`]).
    deterministic: bool,
    direction: Direction,
    window: Window2d,
    groups: usize,
    c_out: usize,
    /// Strides of the two strided operands (x and dy; the other is packed).
    strides: [[usize; 4]; 2],
    /// The byte alignment all three operand pointers share (at most 16): the graph API's
    /// plans are specialised for it.
    alignment: u8,
}

/// The algorithm chosen for a plan, of its direction's kind.
#[derive(Clone, Copy, Debug)]
enum Algo {
    Unset,
    Forward(cs::cudnnConvolutionFwdAlgo_t),
    BackwardData(cs::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(cs::cudnnConvolutionBwdFilterAlgo_t),
}

/// Descriptors and the chosen algorithm of one problem.
struct Plan {
    x: cs::cudnnTensorDescriptor_t,
    y: cs::cudnnTensorDescriptor_t,
    w: cs::cudnnFilterDescriptor_t,
    conv: cs::cudnnConvolutionDescriptor_t,
    algo: Algo,
    /// The math type `algo` was measured with and runs with.
    math: cs::cudnnMathType_t,
    workspace: usize,
    /// The graph API's plan, when it measured faster than `algo` (which then stays unused).
    graph: Option<GraphPlan>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `State::describe` (`cudnn/legacy.rs`) and is destroyed once.
        unsafe {
            cs::cudnnDestroyTensorDescriptor(self.x);
            cs::cudnnDestroyTensorDescriptor(self.y);
            cs::cudnnDestroyFilterDescriptor(self.w);
            cs::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

/// A device's cuDNN handle (bound to its stream) and plans.
pub(crate) struct State {
    handle: cs::cudnnHandle_t,
    /// `None`: cuDNN has no algorithm for the problem (the caller takes another path).
    plans: HashMap<PlanKey, Option<Plan>>,
}

// SAFETY: the handle, descriptors and graph-API plans (whose shared `Rc`s all live in this
// state) are only used under the device's `cudnn` mutex.
unsafe impl Send for State {}

fn check(status: cs::cudnnStatus_t, what: &str) -> Result<()> {
    if status == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("cuDNN {what}: {status:?}")))
    }
}

fn data_type(dtype: DType) -> Option<cs::cudnnDataType_t> {
    use cs::cudnnDataType_t as T;
    Some(match dtype {
        DType::F32 => T::CUDNN_DATA_FLOAT,
        DType::F64 => T::CUDNN_DATA_DOUBLE,
        DType::F16 => T::CUDNN_DATA_HALF,
        DType::BF16 => T::CUDNN_DATA_BFLOAT16,
        _ => return None,
    })
}

fn dims4(d: &[usize]) -> [i32; 4] {
    [d[0] as i32, d[1] as i32, d[2] as i32, d[3] as i32]
}

/// The operands of one direction: `a` and `b` the inputs, `out` the (packed) result.
pub(crate) struct Operands<'a> {
    pub x: (u64, &'a Layout),
    pub w: u64,
    pub y: (u64, &'a Layout),
}

impl State {
    fn new(dev: &CudaDevice) -> Result<State> {
        dev.bind()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the stream outlives the handle (both
        // belong to the device, which lives for the process).
        unsafe {
            check(cs::cudnnCreate(&mut handle), "cudnnCreate")?;
            check(
                cs::cudnnSetStream(handle, dev.stream.cu_stream() as _),
                "cudnnSetStream",
            )?;
        }
        Ok(State {
            handle,
            plans: HashMap::new(),
        })
    }

    /// Chooses how `plan` runs: the legacy API's best algorithm and the graph API's plans
    /// (as [`api`] allows) timed on the call's buffers; `false` when neither API has one.
    /// With the default API and timing, and with the legacy API alone (each in a file of its
    /// own), the choice an earlier process saved for the problem is taken where cuDNN still
    /// offers it, and a new choice is saved (`saved_choices.rs`).
    ///
    /// # Safety
    /// As [`State::find_legacy`].
    unsafe fn choose(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &mut Plan,
        key: &PlanKey,
        w_dims: [usize; 4],
        ops: &Operands<'_>,
    ) -> Result<bool> {
        // The choices' file: one per way of choosing, since each admits other candidates.
        let kind = match (api(), timing()) {
            (Api::Both, Timing::Guarded) => Some("cudnn"),
            (Api::Legacy, _) => Some("cudnn-legacy"),
            _ => None,
        };
        let library = version_label();
        let saved_key = format!("{key:?}");
        if let Some(kind) = kind {
            if let Some(v) = super::saved_choices::lookup(kind, dev, &library, &saved_key) {
                // SAFETY: forwarded to the caller.
                if unsafe { self.take_saved(dev, plan, key, w_dims, ops, &v) }? {
                    if log_choices() {
                        eprintln!(
                            "kiln cuDNN {:?} x {:?}: saved choice {v}",
                            key.direction,
                            ops.x.1.dims()
                        );
                    }
                    return Ok(true);
                }
            }
        }
        // SAFETY: forwarded to the caller.
        let found = unsafe { self.measure(dev, plan, key, w_dims, ops) }?;
        if let (true, Some(kind)) = (found, kind) {
            let text = match &plan.graph {
                Some(g) => format!("graph {}", g.label()),
                None => format!("legacy {}", legacy::legacy_name(plan.algo, plan.math)),
            };
            super::saved_choices::record(kind, dev, &library, &saved_key, &text);
        }
        Ok(found)
    }

    /// Sets `plan` to the saved choice `saved` (`graph LABEL` or `legacy NAME`, as
    /// [`State::choose`] writes them); `false` when cuDNN no longer offers it.
    ///
    /// # Safety
    /// As [`State::find_legacy`].
    unsafe fn take_saved(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &mut Plan,
        key: &PlanKey,
        w_dims: [usize; 4],
        ops: &Operands<'_>,
        saved: &str,
    ) -> Result<bool> {
        if let Some(name) = saved.strip_prefix("legacy ") {
            // The saved algorithm's workspace from cuDNN's heuristics (no search, nothing
            // run); the search itself only where the heuristics no longer list it.
            // SAFETY: forwarded to the caller.
            return Ok(self.legacy_by_name(plan, key, name)?
                || unsafe { self.find_legacy(dev, plan, ops, key, Some(name)) }?);
        }
        let Some(label) = saved.strip_prefix("graph ") else {
            return Ok(false);
        };
        let problem = graph_problem(key, w_dims);
        let Ok(candidates) = cudnn_graph::candidates(self.handle, &problem, candidates()) else {
            return Ok(false);
        };
        let Some(g) = candidates.into_iter().find(|g| g.label() == label) else {
            return Ok(false);
        };
        plan.workspace = g.workspace;
        plan.graph = Some(g);
        Ok(true)
    }

    /// [`State::choose`]'s measurement.
    ///
    /// # Safety
    /// As [`State::find_legacy`].
    unsafe fn measure(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &mut Plan,
        key: &PlanKey,
        w_dims: [usize; 4],
        ops: &Operands<'_>,
    ) -> Result<bool> {
        // The graph API's engines rarely take f64: that stays on the legacy API.
        let f64 = key.dtype == DType::F64;
        let among = |legacy, graph, graph_required| Among {
            legacy,
            graph,
            graph_required,
        };
        // SAFETY (every call below): forwarded to the caller.
        unsafe {
            match api() {
                Api::Legacy => {
                    self.choose_among(dev, plan, key, w_dims, ops, among(true, false, false))
                }
                Api::Graph => {
                    self.choose_among(dev, plan, key, w_dims, ops, among(f64, true, !f64))
                }
                Api::Both => {
                    self.choose_among(dev, plan, key, w_dims, ops, among(true, true, false))
                }
                Api::GraphFirst => {
                    Ok(
                        self.choose_among(dev, plan, key, w_dims, ops, among(false, true, false))?
                            || self.choose_among(
                                dev,
                                plan,
                                key,
                                w_dims,
                                ops,
                                among(true, false, false),
                            )?,
                    )
                }
            }
        }
    }

    /// One pass of [`State::choose`] over the APIs `among` names.
    ///
    /// # Safety
    /// As [`State::find_legacy`].
    unsafe fn choose_among(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &mut Plan,
        key: &PlanKey,
        w_dims: [usize; 4],
        ops: &Operands<'_>,
        among: Among,
    ) -> Result<bool> {
        let d = key.direction;
        let graph_only = among.graph_required;
        // SAFETY: forwarded to the caller.
        let legacy = among.legacy && unsafe { self.find_legacy(dev, plan, ops, key, None) }?;
        let mut graphs = if !among.graph {
            Vec::new()
        } else {
            match cudnn_graph::candidates(self.handle, &graph_problem(key, w_dims), candidates()) {
                Ok(plans) => plans,
                Err(e) if graph_only => return Err(e),
                Err(e) => {
                    if log_choices() {
                        eprintln!("kiln cuDNN {d:?}: graph API unavailable: {e}");
                    }
                    Vec::new()
                }
            }
        };
        let offset = usize::from(legacy);
        let mut failures = Vec::new();
        let (throughput, latency) = if graphs.is_empty() {
            (vec![0.0; offset], vec![0.0; offset])
        } else {
            let mut run = |i: usize| {
                let ran = if i < offset {
                    // SAFETY: forwarded to the caller.
                    unsafe { self.run_legacy(dev, plan, d, ops, key.dtype) }
                } else {
                    // SAFETY: forwarded to the caller.
                    unsafe { run_graph(dev, self.handle, &graphs[i - offset], ops) }
                };
                if let Err(e) = &ran {
                    failures.push(e.to_string());
                }
                ran
            };
            let count = offset + graphs.len();
            let timing = timing();
            let measure =
                |on: bool, rounds_reps: [usize; 2], run: &mut dyn FnMut(usize) -> Result<()>| {
                    if !on {
                        return Ok(vec![f32::INFINITY; count]);
                    }
                    let t = super::launch::time_candidates(dev, count, rounds_reps, run)?;
                    Ok::<_, Error>(t.into_iter().map(|t| t / rounds_reps[1] as f32).collect())
                };
            let throughput = measure(timing != Timing::Latency, [2, 3], &mut run)?;
            // The median, not the best: a legacy call is slow most times, fast some.
            let latency = if timing == Timing::Throughput {
                vec![f32::INFINITY; count]
            } else {
                super::launch::time_single_calls(dev, count, 7, &mut run)?
            };
            if log_verbose() {
                // What the measurements predict beside what an isolated call costs.
                let single = super::launch::time_single_calls(dev, count, 15, &mut run)?;
                for i in 0..count {
                    let name = match i.checked_sub(offset) {
                        Some(g) => graphs[g].label(),
                        None => "legacy".into(),
                    };
                    eprintln!(
                        "kiln cuDNN {d:?} x {:?} candidate {i:2} {name}: back to back {:.4} ms, \
                         isolated {:.4} ms, isolated median of 15 {:.4} ms",
                        ops.x.1.dims(),
                        throughput[i],
                        latency[i],
                        single[i]
                    );
                }
            }
            (throughput, latency)
        };
        let best = pick(timing(), offset, &throughput, &latency);
        let times: Vec<String> = throughput
            .iter()
            .zip(&latency)
            .map(|(t, l)| format!("{t:.4}/{l:.4}"))
            .collect();
        if log_choices() && !graphs.is_empty() {
            let legacy_ms = if legacy { times[0].clone() } else { "-".into() };
            let each: Vec<String> = graphs
                .iter()
                .zip(&times[offset..])
                .map(|(g, t)| format!("{} {t} [{}]", g.label(), g.notes.join(",")))
                .collect();
            eprintln!(
                "kiln cuDNN {d:?} x {:?} y {:?} ms per call back to back/isolated: legacy \
                 {legacy_ms}; graph {}; chose {}",
                ops.x.1.dims(),
                ops.y.1.dims(),
                each.join("; "),
                match best {
                    Some(i) if i >= offset => graphs[i - offset].label(),
                    Some(_) => "legacy".into(),
                    None => "none".into(),
                }
            );
        }
        match best {
            Some(i) if i >= offset => {
                let g = graphs.swap_remove(i - offset);
                plan.workspace = g.workspace;
                plan.graph = Some(g);
                Ok(true)
            }
            Some(_) => Ok(true),
            None if graph_only => Err(Error::Cuda(format!(
                "cuDNN graph API: no engine ran conv2d {d:?} ({:?}, x {:?}, y {:?}) with \
                 KILN_CUDNN_API=graph: {}",
                key.dtype,
                ops.x.1.dims(),
                ops.y.1.dims(),
                failures.join("; ")
            ))),
            None => Ok(legacy),
        }
    }

    /// Runs `plan`.
    ///
    /// # Safety
    /// As [`State::find_legacy`].
    unsafe fn run(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &Plan,
        d: Direction,
        ops: &Operands<'_>,
        dtype: DType,
    ) -> Result<()> {
        match &plan.graph {
            // SAFETY: forwarded to the caller.
            Some(g) => unsafe { run_graph(dev, self.handle, g, ops) },
            // SAFETY: forwarded to the caller.
            None => unsafe { self.run_legacy(dev, plan, d, ops, dtype) },
        }
    }
}

/// `key`'s problem as the graph API describes it.
fn graph_problem(key: &PlanKey, w_dims: [usize; 4]) -> cudnn_graph::Problem {
    let win = &key.window;
    let [oh, ow] = win.out_hw();
    let i64s = |d: [usize; 4]| d.map(|v| v as i64);
    let pair = |p: [usize; 2]| p.map(|v| v as i64);
    let x_dims = win.input_dims();
    cudnn_graph::Problem {
        direction: key.direction,
        dtype: key.dtype,
        tf32: key.tf32,
        exact: key.exact,
        deterministic: key.deterministic,
        x: (
            i64s([x_dims[0], x_dims[1], x_dims[2], x_dims[3]]),
            i64s(key.strides[0]),
        ),
        w: i64s(w_dims),
        y: (i64s([win.n, key.c_out, oh, ow]), i64s(key.strides[1])),
        padding: pair(win.padding),
        stride: pair(win.stride),
        dilation: pair(win.dilation),
        alignment: 1 << key.alignment,
    }
}

/// A workspace of `bytes` from the caching allocator (none for 0) and the pointer to pass:
/// keep the storage until the call is queued (freed blocks are reused in stream order).
fn workspace(dev: &Arc<CudaDevice>, bytes: usize) -> Result<(Option<CudaStorage>, *mut c_void)> {
    if bytes == 0 {
        return Ok((None, std::ptr::null_mut()));
    }
    let ws = CudaStorage::alloc(dev, bytes, DType::U8)?;
    let ptr = ws.buf.ptr as *mut c_void;
    Ok((Some(ws), ptr))
}

/// Runs a graph-API plan on `ops`, with a workspace from the caching allocator.
///
/// # Safety
/// As [`State::find_legacy`].
unsafe fn run_graph(
    dev: &Arc<CudaDevice>,
    handle: cs::cudnnHandle_t,
    plan: &GraphPlan,
    ops: &Operands<'_>,
) -> Result<()> {
    let (_ws, wsp) = workspace(dev, plan.workspace)?;
    if !dev.capturing() {
        super::note_launches(1);
    }
    let pointers = [ops.x.0, ops.w, ops.y.0].map(|p| p as *mut c_void);
    // SAFETY: forwarded to the caller; the workspace holds `plan.workspace` bytes until the
    // stream has used it (the caching allocator reuses freed blocks in stream order).
    unsafe { plan.execute(handle, pointers, wsp) }
}

/// Strides cuDNN reads correctly for every algorithm: NCHW order (each stride at least the
/// extent times the next, as in a packed tensor or a narrowed view of one), positive.
/// Other views (a transposed plane, a broadcast) are copied first: an H100 run showed a
/// backward-filter algorithm returning wrong sums for an input whose H and W were swapped.
pub(crate) fn describable(l: &Layout) -> bool {
    let (d, s) = (l.dims(), l.strides());
    l.rank() == 4 && (0..3).all(|i| s[i] >= s[i + 1] * d[i + 1].max(1)) && s[3] >= 1
}

/// Runs one direction of a convolution through cuDNN, making its plan on first use.
/// Returns `false` (having done nothing) when cuDNN has no algorithm for the problem.
/// `w_dims` is the filter `[c_out, c_in / groups, kh, kw]` (packed); `x` and `y` are
/// described by their layouts (the output operand's layout is contiguous).
///
/// # Safety
/// The pointers must be live buffers holding the elements the layouts (and, for the
/// filter, `w_dims`) index, all of `dtype`; the output operand is written.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn convolve(
    dev: &Arc<CudaDevice>,
    d: Direction,
    dtype: DType,
    window: &Window2d,
    groups: usize,
    w_dims: [usize; 4],
    ops: &Operands<'_>,
) -> Result<bool> {
    dev.check_capture("conv2d (cuDNN)")?;
    let strides = |l: &Layout| {
        [
            l.strides()[0],
            l.strides()[1],
            l.strides()[2],
            l.strides()[3],
        ]
    };
    let tf32 = dtype == DType::F32 && super::tf32_enabled();
    let key = PlanKey {
        dtype,
        tf32,
        exact: (dtype == DType::F64 || (dtype == DType::F32 && !tf32))
            && !super::conv_transforms_enabled(),
        deterministic: super::conv_deterministic(),
        direction: d,
        window: *window,
        groups,
        c_out: w_dims[0],
        strides: [strides(ops.x.1), strides(ops.y.1)],
        // log2 of the largest power of two (at most 16) dividing every operand's address.
        alignment: [ops.x.0, ops.w, ops.y.0]
            .iter()
            .map(|&p| (p | 16).trailing_zeros() as u8)
            .min()
            .unwrap_or(0),
    };
    let mut guard = dev.cudnn.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(State::new(dev)?);
    }
    let state = guard.as_mut().expect("created above");
    dev.bind()?;
    if !state.plans.contains_key(&key) {
        dev.refuse_in_capture(
            "conv2d (cuDNN algorithm search)",
            "a convolution's first call measures cuDNN's algorithms, which synchronises; run \
             the step once before capturing it",
        )?;
        let mut plan = State::describe(&key, w_dims)?;
        // SAFETY: forwarded to the caller.
        let found = unsafe { state.choose(dev, &mut plan, &key, w_dims, ops) }?;
        state.plans.insert(key.clone(), found.then_some(plan));
    }
    let Some(plan) = &state.plans[&key] else {
        return Ok(false);
    };
    // SAFETY: forwarded to the caller.
    unsafe { state.run(dev, plan, d, ops, dtype) }?;
    Ok(true)
}
