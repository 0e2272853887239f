//! cuDNN's legacy convolution API: a problem's descriptors, the search among its algorithms
//! (`cudnnFind*AlgorithmEx` on the call's buffers) and running the chosen one.

use super::*;

impl State {
    /// Creates the descriptors of `key`'s problem.
    pub(super) fn describe(key: &PlanKey, w_dims: [usize; 4]) -> Result<Plan> {
        let Some(dt) = data_type(key.dtype) else {
            return Err(Error::UnsupportedDType {
                op: "conv2d (cuDNN)",
                dtype: key.dtype,
            });
        };
        let win = &key.window;
        let [oh, ow] = win.out_hw();
        let mut plan = Plan {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: Algo::Unset,
            math: cs::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            workspace: 0,
            graph: None,
        };
        let x_dims = dims4(&win.input_dims());
        let y_dims = dims4(&[win.n, key.c_out, oh, ow]);
        let [xs, ys] = key.strides.map(|s| dims4(&s));
        let compute = if key.dtype == DType::F64 {
            cs::cudnnDataType_t::CUDNN_DATA_DOUBLE
        } else {
            cs::cudnnDataType_t::CUDNN_DATA_FLOAT
        };
        let math = match key.dtype {
            DType::F32 if key.tf32 => cs::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            DType::F32 => cs::cudnnMathType_t::CUDNN_FMA_MATH,
            DType::F64 => cs::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            _ => cs::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        };
        // SAFETY (this block): every descriptor is created here (destroyed by `Plan`'s drop,
        // also on an early return) and set from plain values.
        unsafe {
            check(cs::cudnnCreateTensorDescriptor(&mut plan.x), "create x")?;
            check(cs::cudnnCreateTensorDescriptor(&mut plan.y), "create y")?;
            check(cs::cudnnCreateFilterDescriptor(&mut plan.w), "create w")?;
            check(
                cs::cudnnCreateConvolutionDescriptor(&mut plan.conv),
                "create conv",
            )?;
            let [n, c, h, w] = x_dims;
            check(
                cs::cudnnSetTensor4dDescriptorEx(
                    plan.x, dt, n, c, h, w, xs[0], xs[1], xs[2], xs[3],
                ),
                "set x descriptor",
            )?;
            let [n, c, h, w] = y_dims;
            check(
                cs::cudnnSetTensor4dDescriptorEx(
                    plan.y, dt, n, c, h, w, ys[0], ys[1], ys[2], ys[3],
                ),
                "set y descriptor",
            )?;
            let [k, c, h, w] = dims4(&w_dims);
            check(
                cs::cudnnSetFilter4dDescriptor(
                    plan.w,
                    dt,
                    cs::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    k,
                    c,
                    h,
                    w,
                ),
                "set filter descriptor",
            )?;
            check(
                cs::cudnnSetConvolution2dDescriptor(
                    plan.conv,
                    win.padding[0] as i32,
                    win.padding[1] as i32,
                    win.stride[0] as i32,
                    win.stride[1] as i32,
                    win.dilation[0] as i32,
                    win.dilation[1] as i32,
                    cs::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                ),
                "set convolution descriptor",
            )?;
            check(
                cs::cudnnSetConvolutionGroupCount(plan.conv, key.groups as i32),
                "set group count",
            )?;
            check(
                cs::cudnnSetConvolutionMathType(plan.conv, math),
                "set math type",
            )?;
        }
        Ok(plan)
    }

    /// Measures the legacy API's algorithms of `key`'s direction on the call's buffers and
    /// keeps the fastest that succeeds in `plan.algo`; `false` when none does. With
    /// `key.exact` (f32 without TF32 or f64, and `kiln::cuda::set_conv_transforms` off) the
    /// FFT and Winograd algorithms are left out (see [`transforms_inputs`]), with
    /// `key.deterministic` the nondeterministic ones.
    ///
    /// # Safety
    /// The pointers must be the live buffers the plan describes (the output is written).
    ///
    /// `named`: take the algorithm of this [`legacy_name`] (a saved choice) instead of the
    /// fastest; `false` when the search did not return it.
    pub(super) unsafe fn find_legacy(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &mut Plan,
        ops: &Operands<'_>,
        key: &PlanKey,
        named: Option<&str>,
    ) -> Result<bool> {
        let d = key.direction;
        const CANDIDATES: usize = 8;
        // A generous search workspace lets the faster algorithms (FFT, Winograd) compete;
        // shrink it when memory is short.
        let mut ws_bytes = 512usize << 20;
        let ws = loop {
            match CudaStorage::alloc(dev, ws_bytes, DType::U8) {
                Ok(s) => break s,
                Err(_) if ws_bytes > 1 << 20 => ws_bytes /= 4,
                Err(e) => return Err(e),
            }
        };
        let (x, w, y) = (
            ops.x.0 as *mut c_void,
            ops.w as *mut c_void,
            ops.y.0 as *mut c_void,
        );
        let wsp = ws.buf.ptr as *mut c_void;
        let mut returned = 0;
        // One direction's search: `cudnnFind*AlgorithmEx` with its two inputs and its output
        // (descriptor, pointer) in cuDNN's order, then (algo, status ok, time, workspace, math
        // type, deterministic) of each result.
        macro_rules! find {
            ($perf:ty, $find:ident, $algo:path, ($d1:expr, $p1:expr), ($d2:expr, $p2:expr), ($d3:expr, $p3:expr)) => {{
                let mut r = [std::mem::zeroed::<$perf>(); CANDIDATES];
                check(
                    cs::$find(
                        self.handle,
                        $d1,
                        $p1,
                        $d2,
                        $p2,
                        plan.conv,
                        $d3,
                        $p3,
                        CANDIDATES as i32,
                        &mut returned,
                        r.as_mut_ptr(),
                        wsp,
                        ws_bytes,
                    ),
                    stringify!($find),
                )?;
                r[..returned as usize]
                    .iter()
                    .map(|p| {
                        let ok = p.status == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
                        let fixed_order =
                            p.determinism == cs::cudnnDeterminism_t::CUDNN_DETERMINISTIC;
                        ($algo(p.algo), ok, p.time, p.memory, p.mathType, fixed_order)
                    })
                    .collect::<Vec<_>>()
            }};
        }
        // SAFETY: forwarded to the caller; result arrays hold CANDIDATES entries.
        let found = unsafe {
            match d {
                Direction::Forward => find!(
                    cs::cudnnConvolutionFwdAlgoPerf_t,
                    cudnnFindConvolutionForwardAlgorithmEx,
                    Algo::Forward,
                    (plan.x, x),
                    (plan.w, w),
                    (plan.y, y)
                ),
                Direction::BackwardData => find!(
                    cs::cudnnConvolutionBwdDataAlgoPerf_t,
                    cudnnFindConvolutionBackwardDataAlgorithmEx,
                    Algo::BackwardData,
                    (plan.w, w),
                    (plan.y, y),
                    (plan.x, x)
                ),
                Direction::BackwardFilter => find!(
                    cs::cudnnConvolutionBwdFilterAlgoPerf_t,
                    cudnnFindConvolutionBackwardFilterAlgorithmEx,
                    Algo::BackwardFilter,
                    (plan.x, x),
                    (plan.y, y),
                    (plan.w, w)
                ),
            }
        };
        // Results come sorted by time; take the first that ran.
        let Some(&(algo, _, time, memory, math, _)) = found.iter().find(|f| {
            f.1 && f.3 <= ws_bytes
                && admits(key, f.0, f.5)
                && named.is_none_or(|n| n == legacy_name(f.0, f.4))
        }) else {
            return Ok(false);
        };
        if log_choices() {
            eprintln!(
                "kiln cuDNN {d:?} x {:?} y {:?}: legacy {algo:?} ({math:?}, {time:.3} ms, workspace {memory} B)",
                ops.x.1.dims(),
                ops.y.1.dims()
            );
        }
        adopt(plan, algo, math, memory)?;
        Ok(true)
    }

    /// Sets `plan` to the legacy algorithm `name` (a [`legacy_name`] an earlier process
    /// saved for the same key, so admitted then) with the workspace cuDNN's heuristics
    /// (`cudnnGet*Algorithm_v7`) report for it: no search workspace, nothing run. `false`
    /// when the heuristics do not list it as supported.
    pub(super) fn legacy_by_name(
        &self,
        plan: &mut Plan,
        key: &PlanKey,
        name: &str,
    ) -> Result<bool> {
        const LISTED: usize = 32;
        let mut returned = 0;
        // One direction's heuristics: its three descriptors in cuDNN's order, then (algo,
        // status ok, workspace, math type) of each result.
        macro_rules! listed {
            ($perf:ty, $get:ident, $algo:path, $d1:expr, $d2:expr, $d3:expr) => {{
                // SAFETY: plain-data result structs, zeroed before cuDNN fills them.
                let mut r = [unsafe { std::mem::zeroed::<$perf>() }; LISTED];
                // SAFETY: the descriptors are live (`describe`); the array holds LISTED
                // results and cuDNN writes at most the count it is given.
                check(
                    unsafe {
                        cs::$get(
                            self.handle,
                            $d1,
                            $d2,
                            plan.conv,
                            $d3,
                            LISTED as i32,
                            &mut returned,
                            r.as_mut_ptr(),
                        )
                    },
                    stringify!($get),
                )?;
                r[..(returned.max(0) as usize).min(LISTED)]
                    .iter()
                    .map(|p| {
                        let ok = p.status == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
                        ($algo(p.algo), ok, p.memory, p.mathType)
                    })
                    .collect::<Vec<_>>()
            }};
        }
        let listed = match key.direction {
            Direction::Forward => listed!(
                cs::cudnnConvolutionFwdAlgoPerf_t,
                cudnnGetConvolutionForwardAlgorithm_v7,
                Algo::Forward,
                plan.x,
                plan.w,
                plan.y
            ),
            Direction::BackwardData => listed!(
                cs::cudnnConvolutionBwdDataAlgoPerf_t,
                cudnnGetConvolutionBackwardDataAlgorithm_v7,
                Algo::BackwardData,
                plan.w,
                plan.y,
                plan.x
            ),
            Direction::BackwardFilter => listed!(
                cs::cudnnConvolutionBwdFilterAlgoPerf_t,
                cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                Algo::BackwardFilter,
                plan.x,
                plan.y,
                plan.w
            ),
        };
        let Some(&(algo, _, memory, math)) =
            listed.iter().find(|l| l.1 && legacy_name(l.0, l.3) == name)
        else {
            return Ok(false);
        };
        if log_choices() {
            eprintln!(
                "kiln cuDNN {:?}: saved legacy {algo:?} ({math:?}, workspace {memory} B) from the heuristics",
                key.direction
            );
        }
        adopt(plan, algo, math, memory)?;
        Ok(true)
    }

    /// Runs `plan` with its legacy-API algorithm.
    ///
    /// # Safety
    /// As [`State::find_legacy`].
    pub(super) unsafe fn run_legacy(
        &self,
        dev: &Arc<CudaDevice>,
        plan: &Plan,
        d: Direction,
        ops: &Operands<'_>,
        dtype: DType,
    ) -> Result<()> {
        let (_ws, wsp) = workspace(dev, plan.workspace)?;
        let (one_f, zero_f, one_d, zero_d) = (1f32, 0f32, 1f64, 0f64);
        let (one, zero): (*const c_void, *const c_void) = if dtype == DType::F64 {
            (&one_d as *const f64 as _, &zero_d as *const f64 as _)
        } else {
            (&one_f as *const f32 as _, &zero_f as *const f32 as _)
        };
        let (x, w, y) = (
            ops.x.0 as *mut c_void,
            ops.w as *mut c_void,
            ops.y.0 as *mut c_void,
        );
        if !dev.capturing() {
            super::super::note_launches(1);
        }
        // SAFETY: forwarded to the caller; the algorithm enum values came from cuDNN for
        // this direction, and the workspace holds `plan.workspace` bytes until the stream
        // has used it (the caching allocator reuses freed blocks in stream order).
        unsafe {
            match plan.algo {
                Algo::Forward(algo) => check(
                    cs::cudnnConvolutionForward(
                        self.handle,
                        one,
                        plan.x,
                        x,
                        plan.w,
                        w,
                        plan.conv,
                        algo,
                        wsp,
                        plan.workspace,
                        zero,
                        plan.y,
                        y,
                    ),
                    "cudnnConvolutionForward",
                ),
                Algo::BackwardData(algo) => check(
                    cs::cudnnConvolutionBackwardData(
                        self.handle,
                        one,
                        plan.w,
                        w,
                        plan.y,
                        y,
                        plan.conv,
                        algo,
                        wsp,
                        plan.workspace,
                        zero,
                        plan.x,
                        x,
                    ),
                    "cudnnConvolutionBackwardData",
                ),
                Algo::BackwardFilter(algo) => check(
                    cs::cudnnConvolutionBackwardFilter(
                        self.handle,
                        one,
                        plan.x,
                        x,
                        plan.y,
                        y,
                        plan.conv,
                        algo,
                        wsp,
                        plan.workspace,
                        zero,
                        plan.w,
                        w,
                    ),
                    "cudnnConvolutionBackwardFilter",
                ),
                Algo::Unset => Err(Error::Cuda(format!("cuDNN {d:?}: no algorithm chosen"))),
            }
        }
    }
}

/// Whether `algo` computes in a transformed domain (FFT, Winograd). Its rounding then grows
/// with the transform: a 5×5 input gradient in f32 by `WINOGRAD_NONFUSED` (FMA math) was off
/// by 5e-4 relative on the H100, where direct and GEMM algorithms stay near 1e-7. The timed
/// search picked it in one run of four (`KILN_CUDNN_API=legacy`), so exact precision leaves
/// these algorithms out unless `kiln::cuda::set_conv_transforms(true)` allows them.
fn transforms_inputs(algo: Algo) -> bool {
    use cs::cudnnConvolutionBwdDataAlgo_t as D;
    use cs::cudnnConvolutionBwdFilterAlgo_t as W;
    use cs::cudnnConvolutionFwdAlgo_t as F;
    match algo {
        Algo::Forward(a) => matches!(
            a,
            F::CUDNN_CONVOLUTION_FWD_ALGO_FFT
                | F::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING
                | F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD
                | F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
        ),
        Algo::BackwardData(a) => matches!(
            a,
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT
                | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING
                | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD
                | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED
        ),
        Algo::BackwardFilter(a) => matches!(
            a,
            W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT
                | W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING
                | W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED
        ),
        Algo::Unset => false,
    }
}

/// Whether `key`'s problem may run `algo`, which computes in a fixed order when
/// `deterministic`: not a transform in exact precision, not a nondeterministic algorithm when
/// determinism is asked for.
fn admits(key: &PlanKey, algo: Algo, deterministic: bool) -> bool {
    !(key.exact && transforms_inputs(algo)) && (deterministic || !key.deterministic)
}

/// Makes `plan` run legacy algorithm `algo` with math type `math` (the one it was measured
/// or listed with, as PyTorch does) and a workspace of `workspace` bytes.
fn adopt(plan: &mut Plan, algo: Algo, math: cs::cudnnMathType_t, workspace: usize) -> Result<()> {
    plan.algo = algo;
    plan.math = math;
    plan.workspace = workspace;
    // SAFETY: the descriptor is live (made by `describe`, destroyed with the plan).
    check(
        unsafe { cs::cudnnSetConvolutionMathType(plan.conv, math) },
        "set math type",
    )
}

/// How a saved choice names a legacy algorithm: the algorithm and its math type.
pub(super) fn legacy_name(algo: Algo, math: cs::cudnnMathType_t) -> String {
    format!("{algo:?} {math:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_deterministic_keys_refuse_transforms_and_atomics() {
        use cs::cudnnConvolutionBwdFilterAlgo_t as W;
        let key = |exact, deterministic| PlanKey {
            dtype: DType::F32,
            tf32: false,
            exact,
            deterministic,
            direction: Direction::BackwardFilter,
            window: Window2d::new("conv2d", &[2, 3, 8, 8], [3, 3], [1, 1], [1, 1], [1, 1]).unwrap(),
            groups: 1,
            c_out: 4,
            strides: [[192, 64, 8, 1], [256, 64, 8, 1]],
            alignment: 4,
        };
        let gemm = Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
        let fft = Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT);
        assert!(admits(&key(false, false), gemm, false));
        assert!(admits(&key(true, false), gemm, false));
        assert!(
            !admits(&key(false, true), gemm, false),
            "a nondeterministic run"
        );
        assert!(admits(&key(true, true), gemm, true));
        assert!(admits(&key(false, true), fft, true));
        assert!(
            !admits(&key(true, true), fft, true),
            "a transform in exact precision"
        );
    }

    #[test]
    fn transforms_are_the_fft_and_winograd_algorithms_of_every_direction() {
        use cs::cudnnConvolutionBwdDataAlgo_t as D;
        use cs::cudnnConvolutionBwdFilterAlgo_t as W;
        use cs::cudnnConvolutionFwdAlgo_t as F;
        let transforms = [
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_FFT),
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING),
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD),
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED),
            Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT),
            Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING),
            Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD),
            Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED),
            Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT),
            Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING),
            Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED),
        ];
        for a in transforms {
            assert!(
                transforms_inputs(a),
                "{a:?} computes in a transformed domain"
            );
        }
        let direct = [
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM),
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM),
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
            Algo::Forward(F::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT),
            Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0),
            Algo::BackwardData(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1),
            Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0),
            Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1),
            Algo::BackwardFilter(W::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3),
            Algo::Unset,
        ];
        for a in direct {
            assert!(!transforms_inputs(a), "{a:?} is a direct or GEMM algorithm");
        }
    }
}
