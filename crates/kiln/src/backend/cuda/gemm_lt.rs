//! GEMMs through cuBLASLt with a plan per problem, built once and reused.
//!
//! `cublasGemmStridedBatchedEx` chooses its kernel on every call, which costs ~15 µs of host
//! time even for a tiny product; a training step of a small MLP is five such calls. Here the
//! descriptors and the heuristic's algorithm are cached per [`PlanKey`] (shape, operations,
//! leading dimensions, batch strides, pointer alignment, dtype, epilogue), so a repeated
//! product costs one `cublasLtMatmul`. For problems up to ~69 GFLOP the plan times the
//! heuristic's eight candidates on the first call and keeps the fastest: the heuristic's
//! first choice can be far off (for a 10×128 weight gradient with k = 256 and the bias-
//! gradient epilogue it picked a 264-way split that ran 53 µs where others run in ~5). The epilogues fuse a bias add into the forward product
//! and a bias gradient (the sum over k of operand B) into the weight-gradient product.
//!
//! For small f32 problems kiln's own kernel (`gemm_small.rs`) is timed beside the
//! heuristic's candidates, and the plan remembers which won.
//!
//! Timed choices are saved on disk (`saved_choices.rs`): a later process on the same GPU and
//! cuBLASLt version takes the saved choice instead of timing again, so two runs of a program
//! run the same kernels and give the same results to the last bit.
//!
//! Everything here is in cuBLAS's column-major terms: `D (m×n) = op(A) (m×k) · op(B) (k×n)`.
//! `gemm.rs` maps kiln's row-major views onto that.

use super::device::CudaDevice;
use super::gemm_small::GemmEngine;
use super::saved_choices::{self, SavedChoices};
use crate::{DType, Error, Result};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{result as driver, sys::CUdeviceptr};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// What the GEMM's epilogue adds to the plain product.
#[derive(Clone, Copy, Debug)]
pub(super) enum Epilogue {
    None,
    /// `D[i, j] += bias[i]`, `bias` holding `m` elements of D's dtype.
    Bias(CUdeviceptr),
    /// Also writes `Σ_k op(B)[k, j]` (`n` elements of D's dtype) to the pointer.
    BiasGradB(CUdeviceptr),
    /// `D = relu(D + bias[i])`.
    BiasRelu(CUdeviceptr),
    /// `D = gelu_tanh(D + bias[i])`, the pre-activation written to `aux` (m×n, ld m).
    BiasGeluAux {
        bias: CUdeviceptr,
        aux: CUdeviceptr,
    },
}

impl Epilogue {
    fn code(self) -> u8 {
        match self {
            Epilogue::None => 0,
            Epilogue::Bias(_) => 1,
            Epilogue::BiasGradB(_) => 2,
            Epilogue::BiasRelu(_) => 3,
            Epilogue::BiasGeluAux { .. } => 4,
        }
    }

    fn pointer(self) -> Option<CUdeviceptr> {
        match self {
            Epilogue::None => None,
            Epilogue::Bias(p) | Epilogue::BiasGradB(p) | Epilogue::BiasRelu(p) => Some(p),
            Epilogue::BiasGeluAux { bias, .. } => Some(bias),
        }
    }

    fn aux(self) -> Option<CUdeviceptr> {
        match self {
            Epilogue::BiasGeluAux { aux, .. } => Some(aux),
            _ => None,
        }
    }
}

/// One column-major operand: base pointer, leading dimension, batch stride (elements), and
/// whether the GEMM reads it transposed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Operand {
    pub ptr: CUdeviceptr,
    pub ld: usize,
    pub batch_stride: usize,
    pub transposed: bool,
}

/// A GEMM in cuBLAS's terms; D is written contiguous (`ld = m`, batch stride `m·n`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Problem {
    pub dtype: DType,
    pub tf32: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: Operand,
    pub b: Operand,
    pub d: CUdeviceptr,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct PlanKey {
    dtype: DType,
    tf32: bool,
    mnk_batch: [usize; 4],
    /// (ld, batch stride) of A and B.
    strides: [usize; 4],
    transposed: [bool; 2],
    /// log2 of each pointer's alignment (A, B, D, epilogue vector), capped at 256 bytes.
    align: [u8; 4],
    epilogue: u8,
    /// The engine in force when the plan was made (each engine keeps its own plans).
    engine: GemmEngine,
}

/// Descriptors and algorithm of one [`PlanKey`].
struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: usize,
    /// kiln's small kernel (`gemm_small.rs`) measured fastest: it runs instead of `algo`.
    kiln: bool,
}

/// The device's cuBLASLt handle, workspace and plans (`None`: no algorithm; fall back).
pub(crate) struct Lt {
    handle: lt::cublasLtHandle_t,
    workspace: CUdeviceptr,
    plans: HashMap<PlanKey, Option<Plan>>,
    /// Timed choices of earlier processes, and where this one's are saved.
    saved: Arc<Mutex<SavedChoices>>,
}

// SAFETY: the handle and descriptors are only used under the device's `lt` mutex.
unsafe impl Send for Lt {}

const WORKSPACE: usize = 32 << 20;
/// The most algorithms a plan may ask the heuristic for; each is timed once (see [`Lt::fastest`]).
const MAX_CANDIDATES: usize = 32;

/// How many of the heuristic's algorithms a plan times (`KILN_GEMM_CANDIDATES`, 1 to 32;
/// default 8).
fn candidates_wanted() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("KILN_GEMM_CANDIDATES")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(8, |n: usize| n.clamp(1, MAX_CANDIDATES))
    })
}
/// Problems above this many FLOPs keep the heuristic's first choice untimed (timing eight
/// candidates of a large product would cost more than it could save).
const TUNE_MAX_FLOPS: f64 = (1u64 << 36) as f64;

/// Whether plans time the heuristic's candidates (`KILN_GEMM_AUTOTUNE=0` turns it off).
fn autotune_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_GEMM_AUTOTUNE").map_or(true, |v| v != "0"))
}
/// Plans kept before the cache is cleared (a program that sweeps shapes must not grow it
/// without bound; descriptors are a few hundred bytes each).
const MAX_PLANS: usize = 4096;

fn lt_err(what: &'static str) -> impl Fn(lt::cublasStatus_t) -> Error {
    move |s| Error::Cuda(format!("{what}: {s:?}"))
}

fn check(status: lt::cublasStatus_t, what: &'static str) -> Result<()> {
    match status {
        lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        s => Err(lt_err(what)(s)),
    }
}

fn align_log2(ptr: CUdeviceptr) -> u8 {
    (ptr.trailing_zeros().min(8)) as u8
}

fn types(
    dtype: DType,
    tf32: bool,
) -> Option<(lt::cudaDataType, lt::cublasComputeType_t, lt::cudaDataType)> {
    use lt::cublasComputeType_t as C;
    use lt::cudaDataType as T;
    Some(match dtype {
        DType::F32 if tf32 => (
            T::CUDA_R_32F,
            C::CUBLAS_COMPUTE_32F_FAST_TF32,
            T::CUDA_R_32F,
        ),
        DType::F32 => (T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        DType::F64 => (T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F, T::CUDA_R_64F),
        DType::F16 => (T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        DType::BF16 => (T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F, T::CUDA_R_32F),
        _ => return None,
    })
}

impl Lt {
    fn new(dev: &CudaDevice) -> Result<Lt> {
        // SAFETY: probes for the library without calling into it.
        if !unsafe { lt::is_culib_present() } {
            return Err(Error::Cuda(
                "cuBLASLt (libcublasLt) is not installed or not on the library path".into(),
            ));
        }
        let handle = cudarc::cublaslt::result::create_handle()
            .map_err(|e| Error::Cuda(format!("cublasLtCreate: {e:?}")))?;
        // SAFETY: a plain allocation owned by this struct for the process lifetime.
        let workspace = unsafe { driver::malloc_sync(WORKSPACE) }
            .map_err(|e| Error::Cuda(format!("allocating the cuBLASLt workspace: {e:?}")))?;
        // SAFETY: a plain query of the loaded library.
        let version = unsafe { lt::cublasLtGetVersion() };
        let saved = saved_choices::shared("gemm-plans", dev, &format!("cublasLt{version}"));
        Ok(Lt {
            handle,
            workspace,
            plans: HashMap::new(),
            saved,
        })
    }

    /// Builds the plan for `key`, or `None` when cuBLASLt has no algorithm for it.
    ///
    /// # Safety
    /// As [`matmul`]: with several candidates the problem is run (see [`Lt::fastest`]).
    unsafe fn build(
        &mut self,
        dev: &CudaDevice,
        p: &Problem,
        epilogue: Epilogue,
        key: &PlanKey,
    ) -> Result<Option<Plan>> {
        use lt::cublasLtMatmulDescAttributes_t as D;
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        use lt::cublasLtMatrixLayoutAttribute_t as L;
        let mut plan = Plan {
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            // SAFETY: a plain-data struct; overwritten by the heuristic before use.
            algo: unsafe { std::mem::zeroed() },
            workspace: 0,
            kiln: false,
        };
        // Forced to kiln's kernel: no cuBLASLt descriptors (`Plan`'s drop skips null ones).
        if key.engine == GemmEngine::Kiln && super::gemm_small::applies(p, epilogue) {
            plan.kiln = true;
            return Ok(Some(plan));
        }
        let Some((data, compute, scale)) = types(p.dtype, p.tf32) else {
            return Ok(None);
        };
        // SAFETY (this block): every descriptor is created here and destroyed by `Plan`'s
        // drop if building fails; attribute buffers are live locals of the size passed.
        unsafe {
            check(
                lt::cublasLtMatmulDescCreate(&mut plan.desc, compute, scale),
                "cublasLtMatmulDescCreate",
            )?;
            // cublasOperation_t: 0 = N, 1 = T.
            let op = |t: bool| i32::from(t);
            let set_desc = |attr: D, value: *const c_void, size: usize| {
                check(
                    lt::cublasLtMatmulDescSetAttribute(plan.desc, attr, value, size),
                    "cublasLtMatmulDescSetAttribute",
                )
            };
            let (ta, tb) = (op(p.a.transposed), op(p.b.transposed));
            set_desc(
                D::CUBLASLT_MATMUL_DESC_TRANSA,
                &ta as *const _ as _,
                std::mem::size_of_val(&ta),
            )?;
            set_desc(
                D::CUBLASLT_MATMUL_DESC_TRANSB,
                &tb as *const _ as _,
                std::mem::size_of_val(&tb),
            )?;
            let epi = match epilogue {
                Epilogue::None => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
                Epilogue::Bias(_) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
                Epilogue::BiasGradB(_) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADB,
                Epilogue::BiasRelu(_) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
                Epilogue::BiasGeluAux { .. } => {
                    lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                }
            };
            set_desc(
                D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &epi as *const _ as _,
                std::mem::size_of_val(&epi),
            )?;
            if let Some(sms) = sm_count_target() {
                set_desc(
                    D::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                    &sms as *const _ as _,
                    std::mem::size_of_val(&sms),
                )?;
            }
            if let Some(ptr) = epilogue.pointer() {
                set_desc(
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &ptr as *const _ as _,
                    8,
                )?;
            }
            if let Some(aux) = epilogue.aux() {
                set_desc(
                    D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                    &aux as *const _ as _,
                    8,
                )?;
                let ld = p.m as i64;
                set_desc(
                    D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                    &ld as *const _ as _,
                    8,
                )?;
            }
            // Stored shapes: op(A) is m×k, so A itself is k×m when transposed.
            let stored = |o: &Operand, rows: usize, cols: usize| {
                if o.transposed {
                    (cols, rows)
                } else {
                    (rows, cols)
                }
            };
            let shapes = [
                (stored(&p.a, p.m, p.k), p.a.ld, p.a.batch_stride),
                (stored(&p.b, p.k, p.n), p.b.ld, p.b.batch_stride),
                ((p.m, p.n), p.m, p.m * p.n),
            ];
            for (slot, ((rows, cols), ld, bs)) in plan.layouts.iter_mut().zip(shapes) {
                check(
                    lt::cublasLtMatrixLayoutCreate(slot, data, rows as u64, cols as u64, ld as i64),
                    "cublasLtMatrixLayoutCreate",
                )?;
                if p.batch > 1 {
                    let (count, stride) = (p.batch as i32, bs as i64);
                    for (attr, v, s) in [
                        (
                            L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                            &count as *const i32 as *const c_void,
                            4,
                        ),
                        (
                            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            &stride as *const i64 as _,
                            8,
                        ),
                    ] {
                        check(
                            lt::cublasLtMatrixLayoutSetAttribute(*slot, attr, v, s),
                            "cublasLtMatrixLayoutSetAttribute",
                        )?;
                    }
                }
            }
            let mut pref = std::ptr::null_mut();
            check(
                lt::cublasLtMatmulPreferenceCreate(&mut pref),
                "cublasLtMatmulPreferenceCreate",
            )?;
            let ws = WORKSPACE as u64;
            let mut prefs: Vec<(P, u64)> = vec![(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws)];
            for (attr, a) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
            ] {
                prefs.push((attr, 1u64 << a));
            }
            let mut result = Ok(());
            for (attr, v) in prefs {
                // Workspace is a u64 attribute, alignments u32.
                let r = if matches!(attr, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
                    lt::cublasLtMatmulPreferenceSetAttribute(pref, attr, &v as *const u64 as _, 8)
                } else {
                    let v32 = v as u32;
                    lt::cublasLtMatmulPreferenceSetAttribute(pref, attr, &v32 as *const u32 as _, 4)
                };
                result = result.and(check(r, "cublasLtMatmulPreferenceSetAttribute"));
            }
            let mut found = 0;
            let mut results: [lt::cublasLtMatmulHeuristicResult_t; MAX_CANDIDATES] =
                std::mem::zeroed();
            let status = lt::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                plan.desc,
                plan.layouts[0],
                plan.layouts[1],
                plan.layouts[2],
                plan.layouts[2],
                pref,
                candidates_wanted() as i32,
                results.as_mut_ptr(),
                &mut found,
            );
            lt::cublasLtMatmulPreferenceDestroy(pref);
            result?;
            // NOT_SUPPORTED: no algorithm for this combination (e.g. an epilogue for a dtype).
            if status == lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED {
                return Ok(None);
            }
            check(status, "cublasLtMatmulAlgoGetHeuristic")?;
            let candidates: Vec<_> = results[..(found.max(0) as usize).min(candidates_wanted())]
                .iter()
                .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                .map(|r| (r.algo, r.workspaceSize))
                .collect();
            let Some(&(algo, workspace)) = candidates.first() else {
                return Ok(None);
            };
            (plan.algo, plan.workspace) = (algo, workspace);
            let flops = 2.0 * (p.m * p.n * p.k * p.batch) as f64;
            let with_kiln =
                key.engine == GemmEngine::Measure && super::gemm_small::applies(p, epilogue);
            let tuned = (candidates.len() > 1 || with_kiln)
                && flops <= TUNE_MAX_FLOPS
                && autotune_enabled();
            let saved_key = format!("{key:?}");
            // Not inside a capture: kiln's kernel might not be loaded yet (a first launch
            // compiles), so a plan made there keeps cuBLASLt's heuristic choice as before.
            let saved_value = match tuned && !dev.capturing() {
                true => self.saved_value(&saved_key),
                false => None,
            };
            let saved = saved_value.and_then(|v| self.saved_choice(&plan, &v, with_kiln));
            // Timing needs the host to wait for the device: inside a graph capture a new plan
            // keeps the heuristic's choice (a warm-up run before the capture tunes it).
            let timed = tuned && saved.is_none() && !dev.capturing();
            if let Some(choice) = saved {
                plan.take(choice);
            } else if timed {
                let choice = match self.fastest(dev, &plan, &candidates, with_kiln, p, epilogue)? {
                    Some(i) if i == candidates.len() => Some(Choice::Kiln),
                    Some(i) => Some(Choice::Lt(candidates[i].0, candidates[i].1)),
                    None => None,
                };
                if let Some(choice) = choice {
                    plan.take(choice);
                    let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
                    saved.save(&saved_key, &choice.to_text());
                }
            }
            if (timed || saved.is_some()) && std::env::var_os("KILN_GEMM_LOG").is_some() {
                let how = if saved.is_some() {
                    "saved choice"
                } else {
                    "timed"
                };
                log_choice(&plan, p, key, candidates.len(), how);
            }
        }
        Ok(Some(plan))
    }

    /// The saved text for `key`, if any.
    fn saved_value(&self, key: &str) -> Option<String> {
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        saved.get(key).map(str::to_string)
    }

    /// A choice saved by an earlier process (see [`Choice::to_text`]), if it still applies:
    /// kiln's kernel where it may run, or an algorithm `cublasLtMatmulAlgoCheck` accepts for
    /// the plan's descriptors within the workspace.
    fn saved_choice(&self, plan: &Plan, value: &str, with_kiln: bool) -> Option<Choice> {
        match Choice::from_text(value)? {
            Choice::Kiln => with_kiln.then_some(Choice::Kiln),
            Choice::Lt(algo, _) => {
                // SAFETY: a plain-data struct the check fills.
                let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
                // SAFETY: the descriptors are live (created by `build`); `algo` and `result`
                // are locals that outlive the call, which only reads and writes host memory.
                let status = unsafe {
                    lt::cublasLtMatmulAlgoCheck(
                        self.handle,
                        plan.desc,
                        plan.layouts[0],
                        plan.layouts[1],
                        plan.layouts[2],
                        plan.layouts[2],
                        &algo,
                        &mut result,
                    )
                };
                let fits = status == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && result.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && result.workspaceSize <= WORKSPACE;
                fits.then_some(Choice::Lt(algo, result.workspaceSize))
            }
        }
    }

    /// Times each candidate algorithm on the problem's own operands (device events around
    /// back-to-back calls, so a launch-bound candidate pays its host cost too, after a
    /// warm-up run), and with `with_kiln` kiln's small kernel as one more candidate at index
    /// `candidates.len()`; returns the fastest's index, `None` when none ran.
    ///
    /// # Safety
    /// As [`matmul`]: `p`'s pointers address live buffers of the sizes it describes. The
    /// runs write D (and the epilogue's vector), which the caller's own call then rewrites.
    unsafe fn fastest(
        &self,
        dev: &CudaDevice,
        plan: &Plan,
        candidates: &[(lt::cublasLtMatmulAlgo_t, usize)],
        with_kiln: bool,
        p: &Problem,
        epilogue: Epilogue,
    ) -> Result<Option<usize>> {
        let count = candidates.len() + with_kiln as usize;
        super::launch::fastest(dev, count, [3, 5], |i| match candidates.get(i) {
            // SAFETY: forwarded to the caller.
            Some(&(algo, workspace)) => unsafe {
                self.run(dev, plan, &algo, workspace, p, epilogue)
            },
            // SAFETY: forwarded to the caller; `with_kiln` implies `applies(p, epilogue)`.
            None => unsafe { super::gemm_small::run(dev, p, epilogue) },
        })
    }

    /// One `cublasLtMatmul` of `p` with `plan`'s descriptors and `algo`.
    ///
    /// # Safety
    /// As [`matmul`].
    unsafe fn run(
        &self,
        dev: &CudaDevice,
        plan: &Plan,
        algo: &lt::cublasLtMatmulAlgo_t,
        workspace: usize,
        p: &Problem,
        epilogue: Epilogue,
    ) -> Result<()> {
        // The epilogue's pointers change from call to call: set them on the descriptor.
        use lt::cublasLtMatmulDescAttributes_t as D;
        let pointers = [
            (D::CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue.pointer()),
            (D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, epilogue.aux()),
        ];
        for (attr, ptr) in pointers {
            if let Some(ptr) = ptr {
                // SAFETY: the descriptor is live; the pointer value outlives the call.
                check(
                    unsafe {
                        lt::cublasLtMatmulDescSetAttribute(
                            plan.desc,
                            attr,
                            &ptr as *const CUdeviceptr as _,
                            8,
                        )
                    },
                    "cublasLtMatmulDescSetAttribute",
                )?;
            }
        }
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if p.dtype == DType::F64 {
            (&one64 as *const f64 as _, &zero64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &zero32 as *const f32 as _)
        };
        // SAFETY: the plan's descriptors match `p` (same key); operand memory is the
        // caller's contract; alpha/beta are host scalars of the scale type that outlive the
        // call; the workspace holds WORKSPACE ≥ `workspace` bytes, used only on this stream.
        check(
            unsafe {
                lt::cublasLtMatmul(
                    self.handle,
                    plan.desc,
                    alpha,
                    p.a.ptr as *const c_void,
                    plan.layouts[0],
                    p.b.ptr as *const c_void,
                    plan.layouts[1],
                    beta,
                    p.d as *const c_void,
                    plan.layouts[2],
                    p.d as *mut c_void,
                    plan.layouts[2],
                    algo,
                    self.workspace as *mut c_void,
                    workspace,
                    dev.stream.cu_stream() as _,
                )
            },
            "cublasLtMatmul",
        )
    }
}

/// `KILN_GEMM_LOG`'s line for a plan whose choice was timed or read from the saved choices.
fn log_choice(plan: &Plan, p: &Problem, key: &PlanKey, candidates: usize, how: &str) {
    let chose = if plan.kiln {
        "kiln's small kernel".to_string()
    } else {
        let (mut splits, mut written) = (1u32, 0usize);
        // SAFETY: reads one u32 attribute of a live algorithm value into a local.
        unsafe {
            lt::cublasLtMatmulAlgoConfigGetAttribute(
                &plan.algo,
                lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                &mut splits as *mut u32 as _,
                4,
                &mut written,
            )
        };
        match written {
            4 => format!("cuBLASLt, split-K {splits}"),
            _ => "cuBLASLt, split-K ?".into(),
        }
    };
    eprintln!(
        "kiln gemm: {:?} m={} n={} k={} batch={} epilogue={}: {candidates} candidates, {how}: {chose}",
        p.dtype, p.m, p.n, p.k, p.batch, key.epilogue
    );
}

/// What a plan's timing chose, as saved between processes.
#[derive(Clone, Copy)]
enum Choice {
    /// kiln's small kernel.
    Kiln,
    /// A cuBLASLt algorithm and its workspace in bytes.
    Lt(lt::cublasLtMatmulAlgo_t, usize),
}

impl Choice {
    /// `kiln`, or `lt WORKSPACE W0,…,W7` with the algorithm's eight words in hex
    /// (cuBLASLt documents the algorithm value as trivially serialisable for one library
    /// version, which the file's name holds).
    fn to_text(self) -> String {
        match self {
            Choice::Kiln => "kiln".into(),
            Choice::Lt(algo, workspace) => {
                let words: Vec<String> = algo.data.iter().map(|w| format!("{w:x}")).collect();
                format!("lt {workspace} {}", words.join(","))
            }
        }
    }

    fn from_text(text: &str) -> Option<Choice> {
        if text == "kiln" {
            return Some(Choice::Kiln);
        }
        let mut parts = text.strip_prefix("lt ")?.split(' ');
        let workspace = parts.next()?.parse().ok()?;
        let words: Vec<u64> = parts
            .next()?
            .split(',')
            .map(|w| u64::from_str_radix(w, 16).ok())
            .collect::<Option<_>>()?;
        if parts.next().is_some() {
            return None;
        }
        let data: [u64; 8] = words.try_into().ok()?;
        Some(Choice::Lt(lt::cublasLtMatmulAlgo_t { data }, workspace))
    }
}

impl Plan {
    /// Runs `choice` from now on.
    fn take(&mut self, choice: Choice) {
        match choice {
            Choice::Kiln => self.kiln = true,
            Choice::Lt(algo, workspace) => (self.algo, self.workspace) = (algo, workspace),
        }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Lt::build` (null ones are skipped) and is
        // used by no queued call after the plan leaves the cache (cuBLASLt reads descriptors
        // on the host during `cublasLtMatmul` only).
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// Runs `p` through cuBLASLt with `epilogue`. Returns `Ok(false)` when cuBLASLt has no
/// algorithm for it, leaving the caller to compute it another way.
///
/// # Safety
/// The operands' pointers, leading dimensions and batch strides must describe memory inside
/// live device buffers; D must hold `batch·m·n` elements and the epilogue's vector its
/// length (see [`Epilogue`]), all of `p.dtype`.
pub(super) unsafe fn matmul(dev: &CudaDevice, p: &Problem, epilogue: Epilogue) -> Result<bool> {
    dev.check_capture("matmul")?;
    let key = PlanKey {
        dtype: p.dtype,
        tf32: p.tf32,
        mnk_batch: [p.m, p.n, p.k, p.batch],
        strides: [p.a.ld, p.a.batch_stride, p.b.ld, p.b.batch_stride],
        transposed: [p.a.transposed, p.b.transposed],
        align: [
            align_log2(p.a.ptr),
            align_log2(p.b.ptr),
            align_log2(p.d),
            epilogue.pointer().map_or(8, align_log2),
        ],
        epilogue: epilogue.code(),
        engine: super::gemm_small::engine(),
    };
    let mut guard = dev.lt.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        dev.bind()?;
        *guard = Some(Lt::new(dev)?);
    }
    let state = guard.as_mut().expect("created above");
    if !state.plans.contains_key(&key) {
        if state.plans.len() >= MAX_PLANS {
            state.plans.clear();
        }
        dev.bind()?;
        // SAFETY: forwarded to the caller.
        let plan = unsafe { state.build(dev, p, epilogue, &key) }?;
        state.plans.insert(key, plan);
    }
    let Some(plan) = state.plans.get(&key).and_then(Option::as_ref) else {
        return Ok(false);
    };
    if plan.kiln {
        drop(guard);
        // SAFETY: forwarded to the caller; the plan chose kiln's kernel only where it applies.
        unsafe { super::gemm_small::run(dev, p, epilogue) }?;
        return Ok(true);
    }
    dev.bind()?;
    if !dev.capturing() {
        super::note_launches(1);
    }
    // SAFETY: forwarded to the caller.
    unsafe { state.run(dev, plan, &plan.algo, plan.workspace, p, epilogue) }.map_err(|e| {
        Error::Cuda(format!(
            "{e} ({}x{}x{}, batch {}, {}, epilogue {:?})",
            p.m, p.n, p.k, p.batch, p.dtype, epilogue
        ))
    })?;
    Ok(true)
}

/// `KILN_GEMM_SM_COUNT=N`: every cuBLASLt product is planned for N SMs, leaving the rest to
/// work beside it (what PyTorch's `_set_sm_carveout_experimental` does for collectives
/// overlapped with GEMMs). A tuning knob for data-parallel runs; unset, products use every SM.
/// Measured on two H100s (MLP 784-4096³-10, f32): 108 SMs gave 331K samples/s against 339K
/// unset, i.e. no gain there.
fn sm_count_target() -> Option<i32> {
    static SMS: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *SMS.get_or_init(|| {
        std::env::var("KILN_GEMM_SM_COUNT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &i32| n > 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_choices_read_back_as_written_and_malformed_ones_are_refused() {
        let data = [1, 0xdead_beef, u64::MAX, 0, 7, 8, 9, 0x10];
        let text = Choice::Lt(lt::cublasLtMatmulAlgo_t { data }, 4096).to_text();
        assert_eq!(text, "lt 4096 1,deadbeef,ffffffffffffffff,0,7,8,9,10");
        match Choice::from_text(&text) {
            Some(Choice::Lt(algo, 4096)) => assert_eq!(algo.data, data),
            _ => panic!("{text} did not read back"),
        }
        assert!(matches!(Choice::from_text("kiln"), Some(Choice::Kiln)));
        for bad in [
            "",
            "lt",
            "lt 4096",
            "lt x 1,2,3,4,5,6,7,8",
            "lt 4096 1,2,3,4,5,6,7",
            "lt 4096 1,2,3,4,5,6,7,8,9",
            "lt 4096 1,2,3,4,5,6,7,g",
            "lt 4096 1,2,3,4,5,6,7,8 extra",
            "kiln ",
        ] {
            assert!(Choice::from_text(bad).is_none(), "{bad:?} was accepted");
        }
    }
}
