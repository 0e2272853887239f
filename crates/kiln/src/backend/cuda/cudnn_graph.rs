//! One convolution through cuDNN's graph ("backend") API: the engines PyTorch reaches
//! through cudnn-frontend, which include Hopper kernels that the legacy
//! `cudnnFind*AlgorithmEx` list lacks (the H100 run of 2026-11-24 measured the legacy forward
//! at 0.5–0.7× PyTorch in TF32 and bf16 on the same cuDNN).
//!
//! [`candidates`] describes the problem as an operation graph of one convolution node, asks
//! cuDNN's heuristics (mode A, then the fallback list) for engine configurations, drops
//! those whose numerics the precision setting forbids (tensor cores for full-precision f32,
//! down-converted inputs everywhere, as PyTorch does), and finalizes an execution plan for
//! each. `cudnn.rs` times the plans beside the legacy API's best algorithm on the call's own
//! buffers and keeps the fastest.

use super::cudnn::Direction;
use crate::{DType, Error, Result};
use cs::cudnnBackendAttributeName_t as A;
use cs::cudnnBackendAttributeType_t as T;
use cs::cudnnBackendDescriptorType_t as D;
use cudarc::cudnn::sys as cs;
use std::ffi::c_void;
use std::rc::Rc;

/// One backend descriptor, destroyed on drop.
struct Desc(cs::cudnnBackendDescriptor_t);

// SAFETY: a descriptor is plain host memory owned by this value; kiln uses it under the
// device's `cudnn` mutex only.
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnBackendCreateDescriptor` and destroyed once.
        unsafe { cs::cudnnBackendDestroyDescriptor(self.0) };
    }
}

fn check(status: cs::cudnnStatus_t, what: &str) -> Result<()> {
    if status == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("cuDNN graph API, {what}: {status:?}")))
    }
}

impl Desc {
    fn new(ty: D) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: `d` is a valid out-pointer.
        check(
            unsafe { cs::cudnnBackendCreateDescriptor(ty, &mut d) },
            &format!("creating {ty:?}"),
        )?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to the `values`, which must be of the C type `ty` names.
    fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
        // SAFETY: `values` holds `values.len()` elements of the C type `ty` names (the
        // callers below pair them), which cuDNN copies.
        check(
            unsafe {
                cs::cudnnBackendSetAttribute(
                    self.0,
                    name,
                    ty,
                    values.len() as i64,
                    values.as_ptr() as *const c_void,
                )
            },
            &format!("setting {name:?}"),
        )
    }

    fn set_i64(&self, name: A, values: &[i64]) -> Result<()> {
        self.set(name, T::CUDNN_TYPE_INT64, values)
    }

    fn set_desc(&self, name: A, d: &Desc) -> Result<()> {
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &[d.0])
    }

    fn finalize(self, what: &str) -> Result<Desc> {
        // SAFETY: the descriptor is live.
        check(
            unsafe { cs::cudnnBackendFinalize(self.0) },
            &format!("finalizing {what}"),
        )?;
        Ok(self)
    }

    /// Reads up to `out.len()` elements of attribute `name` into `out`; returns how many
    /// cuDNN has.
    ///
    /// # Safety
    /// `V` must be the C type `ty` names (for descriptors: created, unfinalized ones).
    unsafe fn get<V>(&self, name: A, ty: T, out: &mut [V]) -> Result<usize> {
        let mut count = 0i64;
        // A request for the count alone passes a null array, as cuDNN's samples do.
        let array = if out.is_empty() {
            std::ptr::null_mut()
        } else {
            out.as_mut_ptr() as *mut c_void
        };
        // SAFETY: forwarded; `out` has room for `out.len()` elements.
        check(
            unsafe {
                cs::cudnnBackendGetAttribute(self.0, name, ty, out.len() as i64, &mut count, array)
            },
            &format!("reading {name:?}"),
        )?;
        Ok(count.max(0) as usize)
    }
}

impl Desc {
    /// Attribute `name` of `self`: up to `room` descriptors of type `ty`, created here for
    /// cuDNN to fill, as many as it filled.
    fn get_descs(&self, name: A, ty: D, room: usize) -> Result<Vec<Desc>> {
        let descs = (0..room)
            .map(|_| Desc::new(ty))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<_> = descs.iter().map(|d| d.0).collect();
        // SAFETY: `raw` holds `room` created (unfinalized) descriptors of type `ty`.
        let filled = unsafe { self.get(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raw) }?;
        Ok(descs.into_iter().take(filled).collect())
    }
}

/// The unique ids of the three operands in every graph and variant pack.
const UIDS: [i64; 3] = [b'x' as i64, b'w' as i64, b'y' as i64];

/// The problem of one convolution direction, as the graph API describes it. Dims and
/// strides are NCHW (the filter `[c_out, c_in / groups, kh, kw]`, packed); cuDNN infers the
/// group count from the input's and the filter's channels.
pub(crate) struct Problem {
    pub direction: Direction,
    pub dtype: DType,
    /// Tensor cores allowed for f32 (TF32).
    pub tf32: bool,
    /// FFT and Winograd engines left out (exact precision, see `PlanKey::exact`).
    pub exact: bool,
    /// Engines with the `NONDETERMINISTIC` note left out.
    pub deterministic: bool,
    pub x: ([i64; 4], [i64; 4]),
    pub w: [i64; 4],
    pub y: ([i64; 4], [i64; 4]),
    pub padding: [i64; 2],
    pub stride: [i64; 2],
    pub dilation: [i64; 2],
    /// The byte alignment every operand pointer has (a power of two, at most 16).
    pub alignment: i64,
}

/// Descriptors every plan of one problem refers to, kept alive with them.
struct Graph {
    _tensors: [Desc; 3],
    _conv: Desc,
    _op: Desc,
    op_graph: Desc,
}

/// A finalized execution plan of one engine configuration. Not `Send`: the plans of one
/// problem share their graph, and all of them live in one device's cuDNN state, used under
/// its mutex.
pub(crate) struct GraphPlan {
    plan: Desc,
    _config: Desc,
    _graph: Rc<Graph>,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// cuDNN's global engine index and the numerical notes, for logs.
    pub engine: i64,
    pub notes: Vec<String>,
    /// The configuration's knob choices (knob type, value), sorted: one engine can be
    /// proposed several times with different tile sizes or split counts.
    pub knobs: Vec<(u32, i64)>,
}

fn tensor(
    uid: i64,
    dt: cs::cudnnDataType_t,
    dims: &[i64; 4],
    strides: &[i64; 4],
    alignment: i64,
) -> Result<Desc> {
    let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[dt],
    )?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, dims)?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_STRIDES, strides)?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[alignment])?;
    t.finalize("a tensor descriptor")
}

fn packed_strides(d: &[i64; 4]) -> [i64; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

impl Problem {
    fn graph(&self, handle: cs::cudnnHandle_t) -> Result<Graph> {
        use cs::cudnnDataType_t as Dt;
        let dt = match self.dtype {
            DType::F32 => Dt::CUDNN_DATA_FLOAT,
            DType::F64 => Dt::CUDNN_DATA_DOUBLE,
            DType::F16 => Dt::CUDNN_DATA_HALF,
            DType::BF16 => Dt::CUDNN_DATA_BFLOAT16,
            dtype => {
                return Err(Error::UnsupportedDType {
                    op: "conv2d (cuDNN graph API)",
                    dtype,
                })
            }
        };
        let double = self.dtype == DType::F64;
        let compute = if double {
            Dt::CUDNN_DATA_DOUBLE
        } else {
            Dt::CUDNN_DATA_FLOAT
        };
        let a = self.alignment;
        let tensors = [
            tensor(UIDS[0], dt, &self.x.0, &self.x.1, a)?,
            tensor(UIDS[1], dt, &self.w, &packed_strides(&self.w), a)?,
            tensor(UIDS[2], dt, &self.y.0, &self.y.1, a)?,
        ];
        let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[compute],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[cs::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &self.padding)?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &self.padding)?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &self.stride)?;
        conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &self.dilation)?;
        let conv = conv.finalize("the convolution descriptor")?;

        let (op_type, [x_attr, w_attr, y_attr, conv_attr, alpha_attr, beta_attr]) =
            match self.direction {
                Direction::Forward => (
                    D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                    [
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                    ],
                ),
                Direction::BackwardData => (
                    D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                    [
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                    ],
                ),
                Direction::BackwardFilter => (
                    D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                    [
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                        A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                    ],
                ),
            };
        let op = Desc::new(op_type)?;
        op.set_desc(x_attr, &tensors[0])?;
        op.set_desc(w_attr, &tensors[1])?;
        op.set_desc(y_attr, &tensors[2])?;
        op.set_desc(conv_attr, &conv)?;
        if double {
            op.set(alpha_attr, T::CUDNN_TYPE_DOUBLE, &[1f64])?;
            op.set(beta_attr, T::CUDNN_TYPE_DOUBLE, &[0f64])?;
        } else {
            op.set(alpha_attr, T::CUDNN_TYPE_FLOAT, &[1f32])?;
            op.set(beta_attr, T::CUDNN_TYPE_FLOAT, &[0f32])?;
        }
        let op = op.finalize("the convolution operation")?;

        let op_graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        op_graph.set(
            A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        op_graph.set_desc(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &op)?;
        let op_graph = op_graph.finalize("the operation graph")?;
        Ok(Graph {
            _tensors: tensors,
            _conv: conv,
            _op: op,
            op_graph,
        })
    }

    /// Whether `engine`, with these numerical notes, computes in the precision asked for (and
    /// in a fixed order, when `deterministic`).
    fn allows(&self, engine: i64, notes: &[u32]) -> bool {
        use cs::cudnnBackendNumericalNote_t as N;
        let has = |n: N| notes.contains(&(n as u32));
        let full_f32 = self.dtype == DType::F32 && !self.tf32;
        // Exact precision also leaves out the engines that compute in a transformed domain,
        // as the legacy search does (`transforms_inputs` in `cudnn/legacy.rs`).
        let forbidden = has(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
            || (self.deterministic && has(N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC))
            || (full_f32 && has(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
            || (self.exact
                && (has(N::CUDNN_NUMERICAL_NOTE_FFT)
                    || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD)
                    || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4)
                    || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6)
                    || has(N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13)));
        let inexact = self.exact && INEXACT_ENGINES.contains(&(self.direction, engine));
        !forbidden && !inexact
    }
}

/// Engines that compute less precisely than their numerical notes say, left out where exact
/// precision is asked for (cudnn-frontend keeps such an errata list too).
/// - Weight gradient, engine 17: 7.6e-4 relative error (norm) on an f32 weight gradient of
///   b16 32→64 14² 5×5, with no `TENSOR_CORE` note, on an H200 with cuDNN 9.14 (where the
///   legacy `BWD_FILTER_ALGO_1` and engine 67 stay within 1e-5). The exact-f32 CNN's
///   32→64 weight gradient had chosen it (`tests/conv_deterministic.rs` found it).
const INEXACT_ENGINES: [(Direction, i64); 1] = [(Direction::BackwardFilter, 17)];

/// The engine configurations heuristics `mode` proposes for `graph`.
fn configs(graph: &Graph, mode: cs::cudnnBackendHeurMode_t) -> Result<Vec<Desc>> {
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &graph.op_graph)?;
    heur.set(
        A::CUDNN_ATTR_ENGINEHEUR_MODE,
        T::CUDNN_TYPE_HEUR_MODE,
        &[mode],
    )?;
    let heur = heur.finalize(&format!("heuristics {mode:?}"))?;
    let mut none: [cs::cudnnBackendDescriptor_t; 0] = [];
    // SAFETY: asks for the count only (no elements are written).
    let count = unsafe {
        heur.get(
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &mut none,
        )
    }?;
    heur.get_descs(
        A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
        D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
        count,
    )
}

/// The engine index and numerical notes of an engine configuration.
fn engine_of(config: &Desc) -> Result<(i64, Vec<u32>)> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut raw = [engine.0];
    // SAFETY: `raw` holds one created engine descriptor for cuDNN to fill.
    unsafe {
        config.get(
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &mut raw,
        )
    }?;
    let mut index = [0i64];
    // SAFETY: one i64.
    unsafe {
        engine.get(
            A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
            T::CUDNN_TYPE_INT64,
            &mut index,
        )
    }?;
    // Read as plain integers: a cuDNN newer than the bindings may report a kind they lack.
    // Room for 16 notes first (cuDNN 9 defines fewer kinds), then exactly the bindings' count
    // of kinds, in case a version refuses a request above its own count.
    let mut notes = [u32::MAX; 16];
    let count = cs::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_TYPE_COUNT as usize;
    let mut read = |len: usize| {
        // SAFETY: `notes` has room for `len` (≤ 16) notes of C enum size.
        unsafe {
            engine.get(
                A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                T::CUDNN_TYPE_NUMERICAL_NOTE,
                &mut notes[..len],
            )
        }
    };
    let n = read(16).or_else(|_| read(count.min(16)))?;
    Ok((index[0], notes[..n.min(notes.len())].to_vec()))
}

/// The knob choices of an engine configuration as (knob type, value), sorted by type.
fn knobs_of(config: &Desc) -> Result<Vec<(u32, i64)>> {
    // Room for more knobs than cuDNN 9 defines for one engine.
    let choices = config.get_descs(
        A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
        D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
        24,
    )?;
    let mut knobs = Vec::with_capacity(choices.len());
    for choice in &choices {
        // The knob type is a C enum; read it as a plain integer (a newer cuDNN may name
        // knobs the bindings lack).
        let mut kind = [0u32];
        let mut value = [0i64];
        // SAFETY: one C enum and one i64.
        unsafe {
            choice.get(
                A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                T::CUDNN_TYPE_KNOB_TYPE,
                &mut kind,
            )?;
            choice.get(
                A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                T::CUDNN_TYPE_INT64,
                &mut value,
            )?;
        }
        knobs.push((kind[0], value[0]));
    }
    knobs.sort_unstable();
    Ok(knobs)
}

fn note_name(n: u32) -> String {
    use cs::cudnnBackendNumericalNote_t as N;
    let known = [
        N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
        N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
        N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        N::CUDNN_NUMERICAL_NOTE_FFT,
        N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD,
    ];
    match known.iter().find(|&&k| k as u32 == n) {
        Some(k) => format!("{k:?}")
            .trim_start_matches("CUDNN_NUMERICAL_NOTE_")
            .to_lowercase(),
        None => format!("note {n}"),
    }
}

/// Up to `limit` finalized plans for `problem`, in the heuristics' order (mode A first, then
/// the fallback list), each of an engine whose numerics the problem allows; an error saying
/// why each engine was passed over when none is left.
pub(crate) fn candidates(
    handle: cs::cudnnHandle_t,
    problem: &Problem,
    limit: usize,
) -> Result<Vec<GraphPlan>> {
    use cs::cudnnBackendHeurMode_t as H;
    let graph = Rc::new(problem.graph(handle)?);
    let mut plans: Vec<GraphPlan> = Vec::new();
    // Why each heuristics mode or engine was passed over, for the error when none is left.
    let mut skipped: Vec<String> = Vec::new();
    'modes: for mode in [H::CUDNN_HEUR_MODE_A, H::CUDNN_HEUR_MODE_FALLBACK] {
        // A mode cuDNN does not offer for this graph leaves the other.
        let configs = match configs(&graph, mode) {
            Ok(c) if c.is_empty() => {
                skipped.push(format!("{mode:?} proposed no engine"));
                continue;
            }
            Ok(c) => c,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        for config in configs {
            if plans.len() >= limit {
                break 'modes;
            }
            let (engine, notes) = match engine_of(&config) {
                Ok(e) => e,
                Err(e) => {
                    skipped.push(e.to_string());
                    continue;
                }
            };
            // The same engine with other knobs (tile shape, split-K) is another candidate;
            // the fallback list repeats mode A's configurations.
            let knobs = knobs_of(&config).unwrap_or_default();
            if plans.iter().any(|p| p.engine == engine && p.knobs == knobs) {
                continue;
            }
            if !problem.allows(engine, &notes) {
                skipped.push(format!("engine {engine}: numerics not allowed"));
                continue;
            }
            let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[handle],
            )?;
            plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &config)?;
            // An engine that cannot build this plan is skipped.
            let plan = match plan.finalize(&format!("the plan of engine {engine}")) {
                Ok(p) => p,
                Err(e) => {
                    skipped.push(e.to_string());
                    continue;
                }
            };
            let mut workspace = [0i64];
            // SAFETY: one i64.
            unsafe {
                plan.get(
                    A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                    T::CUDNN_TYPE_INT64,
                    &mut workspace,
                )
            }?;
            plans.push(GraphPlan {
                plan,
                _config: config,
                _graph: graph.clone(),
                workspace: workspace[0].max(0) as usize,
                engine,
                notes: notes.iter().map(|&n| note_name(n)).collect(),
                knobs,
            });
        }
    }
    if plans.is_empty() {
        skipped.dedup();
        return Err(Error::Cuda(format!(
            "cuDNN graph API has no plan for conv2d {:?} ({:?}, x {:?}, w {:?}, y {:?}): {}",
            problem.direction,
            problem.dtype,
            problem.x.0,
            problem.w,
            problem.y.0,
            skipped.join("; ")
        )));
    }
    Ok(plans)
}

impl GraphPlan {
    /// The engine and its knob choices, for logs: `engine 12 [k3=2,k7=1]`.
    pub(crate) fn label(&self) -> String {
        let knobs: Vec<String> = self
            .knobs
            .iter()
            .map(|(k, v)| format!("k{k}={v}"))
            .collect();
        format!("engine {} [{}]", self.engine, knobs.join(","))
    }

    /// Queues the plan on the handle's stream.
    ///
    /// # Safety
    /// `pointers` (x, w, y) must be live buffers the plan's problem describes (the output
    /// operand is written) and `workspace` must hold `self.workspace` bytes (or be null when
    /// that is 0), all until the stream has run the plan.
    pub(crate) unsafe fn execute(
        &self,
        handle: cs::cudnnHandle_t,
        pointers: [*mut c_void; 3],
        workspace: *mut c_void,
    ) -> Result<()> {
        let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set_i64(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &UIDS)?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &pointers,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
        let pack = pack.finalize("the variant pack")?;
        // SAFETY: forwarded to the caller.
        check(
            unsafe { cs::cudnnBackendExecute(handle, self.plan.0, pack.0) },
            &format!("executing {}", self.label()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small weight-gradient problem in exact f32 (`exact`) or TF32.
    fn problem(exact: bool, deterministic: bool) -> Problem {
        Problem {
            direction: Direction::BackwardFilter,
            dtype: DType::F32,
            tf32: !exact,
            exact,
            deterministic,
            x: ([2, 3, 8, 8], [192, 64, 8, 1]),
            w: [4, 3, 3, 3],
            y: ([2, 4, 8, 8], [256, 64, 8, 1]),
            padding: [1, 1],
            stride: [1, 1],
            dilation: [1, 1],
            alignment: 16,
        }
    }

    #[test]
    fn deterministic_problems_refuse_nondeterministic_engines() {
        use cs::cudnnBackendNumericalNote_t as N;
        let atomics = [N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC as u32];
        let tensor_cores = [N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32];
        assert!(problem(false, false).allows(1, &atomics));
        assert!(!problem(false, true).allows(1, &atomics));
        assert!(problem(false, true).allows(1, &tensor_cores));
        assert!(problem(true, true).allows(1, &[]));
    }

    #[test]
    fn exact_problems_refuse_the_engines_known_to_be_inexact() {
        assert!(!problem(true, false).allows(17, &[]));
        assert!(problem(false, false).allows(17, &[]), "TF32 allows it");
        assert!(problem(true, false).allows(67, &[]));
    }
}
