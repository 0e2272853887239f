//! Convolution, pooling and batch norm against plain f64 loop nests, on random data, every
//! float dtype, contiguous and non-contiguous inputs, odd sizes and combinations of
//! stride, padding, dilation and groups, on every device; and the shape errors.

mod common;
use common::conv::*;
use common::*;
use kiln::op::EpilogueActivation;
use kiln::{Conv2dOptions, DType, Device, Error, Generator, RunningStats, Tensor};

/// (input [n, c, h, w], weight [c_out, c/groups, kh, kw], options) cases.
fn conv_cases() -> Vec<([usize; 4], [usize; 4], Conv2dOptions)> {
    let o = Conv2dOptions::default;
    vec![
        ([2, 3, 7, 5], [4, 3, 3, 3], o()),
        ([1, 2, 6, 9], [3, 2, 3, 2], o().padding(1)),
        ([3, 4, 9, 8], [6, 2, 3, 3], o().padding(1).groups(2)),
        ([2, 3, 11, 10], [5, 3, 5, 3], o().stride(2).padding(2)),
        (
            [1, 2, 10, 9],
            [2, 2, 3, 2],
            Conv2dOptions {
                stride: [2, 3],
                padding: [1, 2],
                dilation: [2, 1],
                groups: 1,
            },
        ),
        // "Same" padding, stride 1 (a tap's rows are one run in the CPU's unfold).
        (
            [2, 3, 6, 7],
            [4, 3, 3, 5],
            Conv2dOptions {
                padding: [1, 2],
                ..o()
            },
        ),
        ([2, 4, 5, 5], [4, 1, 3, 3], o().padding(1).groups(4)), // depthwise
        ([1, 1, 6, 6], [2, 1, 6, 6], o()),                      // kernel = input: 1x1 out
        // More output channels than one block of CUDA's direct kernel holds (16), the last
        // block partly filled; and exactly its 64 taps per channel.
        ([3, 2, 8, 7], [20, 2, 3, 3], o().padding(1)),
        (
            [2, 4, 6, 5],
            [17, 4, 4, 4],
            Conv2dOptions {
                padding: [2, 1],
                ..o()
            },
        ),
        // Shapes of the CPU's direct f32 kernel (AVX-512; at least 16 channels a group):
        // a partly filled second tile of 32 channels and rows of three pixel tiles (31
        // wide); groups, dilation and a batch of one (rows shared between threads); a
        // stride (its input gradient goes through the unfolded path).
        ([2, 16, 9, 31], [40, 16, 3, 3], o().padding(1)),
        (
            [1, 32, 7, 6],
            [32, 16, 3, 3],
            Conv2dOptions {
                padding: [2, 1],
                dilation: [2, 1],
                groups: 2,
                ..o()
            },
        ),
        ([2, 16, 11, 12], [17, 16, 3, 3], o().stride(2).padding(1)),
        // Edge pixels whose kernel columns partly, or wholly, read padding: the channel
        // kernel skips them at those columns (one or two pixels on either side of a 14-wide
        // row under 5×5 with padding 2; one on the left of the first and the right of the
        // second tile of a 28-wide row), and multiplies the padding where a column's edges
        // are wider or on both sides (the next two).
        ([2, 16, 5, 14], [32, 16, 5, 5], o().padding(2)),
        ([1, 16, 3, 28], [20, 16, 3, 3], o().padding(1)),
        (
            [1, 16, 5, 7],
            [16, 16, 3, 3],
            Conv2dOptions {
                padding: [1, 3],
                dilation: [1, 2],
                ..o()
            },
        ),
        (
            [2, 16, 4, 5],
            [18, 16, 3, 3],
            Conv2dOptions {
                padding: [1, 3],
                ..o()
            },
        ),
        // The CPU's Winograd kernels (AVX-512; stride 1, 3×3 or 5×5, 16 or more channels,
        // a batch of two or more): channel counts that leave partial vectors (17 in, 33
        // out), images that leave partial tiles (13×11 in 4×4 tiles; 9×8 in 2×2), padding
        // that differs by side; their input gradients run the same kernels.
        ([3, 17, 13, 11], [33, 17, 3, 3], o().padding(1)),
        (
            [2, 20, 9, 10],
            [16, 20, 5, 5],
            Conv2dOptions {
                padding: [2, 1],
                ..o()
            },
        ),
        // The CPU's pixel kernel (fewer than 64 taps a channel, 8 or more channels a group):
        // rows of 37 (three vectors, the last masked) and a second, partly filled tile of 8
        // channels; a vertical stride with dilation, a batch of one.
        ([2, 3, 10, 37], [12, 3, 3, 3], o().padding(1)),
        (
            [1, 2, 9, 20],
            [9, 2, 3, 3],
            Conv2dOptions {
                stride: [2, 1],
                padding: [1, 2],
                dilation: [1, 2],
                groups: 1,
            },
        ),
    ]
}

/// The tolerance of a sum of `terms` products in `dtype` (f32 on CUDA may use TF32 only
/// when asked; it is not here).
fn sum_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

#[test]
fn conv2d_matches_reference() {
    let mut rng = Generator::new(7);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (k, case) in conv_cases().into_iter().enumerate() {
                check_forward(&mut rng, k, case, dtype, &device);
            }
        }
    }
}

/// One case of [`conv2d_matches_reference`] (`k` picks the input's and weight's views):
/// with and without bias, and with a fused ReLU.
fn check_forward(
    rng: &mut Generator,
    k: usize,
    (xs, ws, o): ([usize; 4], [usize; 4], Conv2dOptions),
    dtype: DType,
    device: &Device,
) {
    let variant = VARIANTS[k % VARIANTS.len()];
    let wvariant = VARIANTS[(k + 2) % VARIANTS.len()];
    let x = input(rng, &xs, dtype, device, variant, Range::Signed);
    let w = input(rng, &ws, dtype, device, wvariant, Range::Signed);
    let bias_vals = random_vals(rng, ws[0], dtype, Range::Signed);
    let bias = tensor_of(&bias_vals, &[ws[0]], dtype, device);
    for (with_bias, act) in [
        (true, None),
        (false, None),
        (true, Some(EpilogueActivation::Relu)),
    ] {
        let b = with_bias.then_some(&bias);
        let got = x.t.conv2d_act(&w.t, b, o, act).unwrap();
        let (mut want, shape) = conv_reference(
            &x.vals,
            xs,
            &w.vals,
            ws,
            with_bias.then_some(&bias_vals[..]),
            &o,
        );
        if act.is_some() {
            want.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        assert_eq!(got.dims(), shape);
        let ctx = format!(
            "conv2d {xs:?} * {ws:?} {o:?} bias {with_bias} act {act:?} {dtype} \
             {variant:?}/{wvariant:?} on {device} ({})",
            kiln::simd_level()
        );
        assert_norm_close(&ctx, &values(&got), &want, sum_tol(dtype));
    }
}

/// The CPU's f32 kernels at every SIMD level this CPU runs (the direct kernels have AVX-512
/// and AVX2 tiles, the baseline goes through the unfolded matrix): every forward and
/// gradient case of the tests above. The level is process-wide, so the other tests of this
/// file may meanwhile run at a lower one; every level computes the same results.
#[test]
fn cpu_convolutions_match_reference_at_every_simd_level() {
    use kiln::SimdLevel;
    let before = kiln::simd_level();
    let mut rng = Generator::new(27);
    let levels = [SimdLevel::Avx512, SimdLevel::Avx2, SimdLevel::Scalar];
    for level in levels.into_iter().filter(|l| l.is_supported()) {
        kiln::set_simd_level(level).unwrap();
        for (k, case) in conv_cases().into_iter().enumerate() {
            check_forward(&mut rng, k, case, DType::F32, &Device::Cpu);
        }
        for (k, case) in gradient_cases().into_iter().enumerate() {
            check_grads(&mut rng, k, case, DType::F32, &Device::Cpu);
        }
    }
    kiln::set_simd_level(before).unwrap();
}

/// Every conv2d gradient (input, weight, bias) in every dtype against the f64 loop nest, on
/// every device; besides `conv_cases`, shapes of kiln's CUDA row-staged weight gradient
/// (stride 1, filter rows of 3, 5 and 7 taps, rows a multiple of 4 wide or not, more
/// output channels than its 32 a block, a tall image split into bands) and first-layer
/// input gradients.
#[test]
fn conv2d_gradients_match_reference() {
    let mut rng = Generator::new(17);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (k, case) in gradient_cases().into_iter().enumerate() {
                check_grads(&mut rng, k, case, dtype, &device);
            }
        }
    }
}

/// [`conv_cases`] and the gradient-only shapes of [`conv2d_gradients_match_reference`].
fn gradient_cases() -> Vec<([usize; 4], [usize; 4], Conv2dOptions)> {
    let o = Conv2dOptions::default;
    let mut cases = conv_cases();
    cases.extend([
        ([3, 1, 12, 12], [40, 1, 5, 5], o().padding(2)),
        ([2, 3, 9, 10], [6, 3, 3, 3], o().padding(1)),
        ([1, 2, 7, 13], [5, 2, 7, 7], o().padding(3)),
        ([2, 1, 30, 8], [8, 1, 3, 3], o()),
        // The CPU's direct weight gradient for a batch of one (bands of output rows shared
        // between threads), 20 channels (one block of 16 transposed in registers, 4 not).
        ([1, 3, 13, 21], [20, 3, 3, 3], o().padding(1)),
        // A one-row image under a 5-row filter: its last kernel rows reach the image at no
        // output row (the direct weight gradient's row ranges are empty there).
        ([2, 3, 1, 6], [16, 3, 5, 5], o().padding(2)),
        // First-layer input gradients (one or three input channels, stride 1, 3, 5 or 7
        // filter rows): a row wider than 64, filters wider than tall and taller than wide,
        // many output channels reduced into one input channel.
        ([2, 1, 9, 70], [6, 1, 7, 7], o().padding(3)),
        (
            [1, 3, 11, 9],
            [5, 3, 5, 7],
            Conv2dOptions {
                padding: [2, 3],
                ..o()
            },
        ),
        (
            [2, 3, 6, 6],
            [4, 3, 7, 3],
            Conv2dOptions {
                padding: [3, 1],
                ..o()
            },
        ),
        ([1, 1, 28, 28], [64, 1, 5, 5], o().padding(2)),
    ]);
    cases
}

/// One case of [`conv2d_gradients_match_reference`] (`k` picks the input's view).
fn check_grads(
    rng: &mut Generator,
    k: usize,
    (xs, ws, o): ([usize; 4], [usize; 4], Conv2dOptions),
    dtype: DType,
    device: &Device,
) {
    let variant = VARIANTS[k % VARIANTS.len()];
    let Params {
        x, w, xv, wv, bv, ..
    } = tracked_params(rng, xs, ws, dtype, device, variant);
    let y = xv.conv2d(&wv, Some(&bv), o).unwrap();
    let (r_vals, grads) = seeded_backward(rng, &y, dtype, device);
    let want = conv_grads_reference(&x.vals, xs, &w.vals, ws, &r_vals, &o);
    let ctx = |what: &str| {
        format!(
            "d{what} of conv2d {xs:?} * {ws:?} {o:?} {dtype} {variant:?} on {device} ({})",
            kiln::simd_level()
        )
    };
    assert_conv_grads(ctx, &grads, [&xv, &wv, &bv], &want, sum_tol(dtype));
}

/// Exact f32 stays exact on problems large enough for cuDNN's timed search to consider its
/// FFT and Winograd algorithms (ResNet-like 3×3 over 32 channels at 28², a 5×5 layer): the
/// forward and all three gradients within f32's tolerance of the f64 loop nests, on every
/// device. On the H100 a 5×5 input gradient by `WINOGRAD_NONFUSED` was off by 5e-4.
#[test]
fn large_f32_convolutions_stay_exact() {
    let mut rng = Generator::new(23);
    let o = Conv2dOptions::default;
    let dtype = DType::F32;
    for device in devices() {
        for (xs, ws, o) in [
            ([4, 32, 28, 28], [32, 32, 3, 3], o().padding(1)),
            ([4, 16, 20, 20], [32, 16, 5, 5], o().padding(2)),
        ] {
            let Params {
                x,
                w,
                bias_vals,
                xv,
                wv,
                bv,
            } = tracked_params(&mut rng, xs, ws, dtype, &device, Variant::Contiguous);
            let ctx =
                |what: &str| format!("{what} of conv2d {xs:?} * {ws:?} {o:?} f32 on {device}");
            let y = xv.conv2d(&wv, Some(&bv), o).unwrap();
            let (want, _) = conv_reference(&x.vals, xs, &w.vals, ws, Some(&bias_vals), &o);
            assert_norm_close(&ctx("y"), &values(&y), &want, sum_tol(dtype));
            let (r_vals, grads) = seeded_backward(&mut rng, &y, dtype, &device);
            let want = conv_grads_reference(&x.vals, xs, &w.vals, ws, &r_vals, &o);
            let ctx = |what: &str| ctx(&format!("d{what}"));
            assert_conv_grads(ctx, &grads, [&xv, &wv, &bv], &want, sum_tol(dtype));
        }
    }
}

/// The gradients through a convolution with its bias and ReLU fused (`conv2d_act`, one op
/// where the backend fuses them: cuDNN/kiln's CUDA kernels, the CPU's direct kernels), on
/// the shapes of `conv_cases`: the seed passes where kiln's output is positive.
#[test]
fn conv2d_bias_relu_gradients_match_reference() {
    let mut rng = Generator::new(19);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (k, (xs, ws, o)) in conv_cases().into_iter().enumerate() {
                let variant = VARIANTS[k % VARIANTS.len()];
                let Params {
                    x,
                    w,
                    bias_vals,
                    xv,
                    wv,
                    bv,
                } = tracked_params(&mut rng, xs, ws, dtype, &device, variant);
                let y = xv
                    .conv2d_act(&wv, Some(&bv), o, Some(EpilogueActivation::Relu))
                    .unwrap();
                let (r_vals, grads) = seeded_backward(&mut rng, &y, dtype, &device);
                // The seed passes where kiln's output is positive. In 16-bit dtypes an output
                // that rounds across zero may differ from the f64 pre-activation's sign, but
                // only where that pre-activation is tiny.
                let (pre, _) = conv_reference(&x.vals, xs, &w.vals, ws, Some(&bias_vals), &o);
                let out = values(&y);
                let rms = (pre.iter().map(|p| p * p).sum::<f64>() / pre.len() as f64).sqrt();
                for (&got, &p) in out.iter().zip(&pre) {
                    assert!(
                        (got > 0.0) == (p > 0.0) || p.abs() < 1e-2 * rms,
                        "conv2d+bias+relu {xs:?} * {ws:?} {dtype} on {device}: output {got} \
                         against pre-activation {p}"
                    );
                }
                let passed: Vec<f64> = r_vals
                    .iter()
                    .zip(&out)
                    .map(|(&g, &y)| if y > 0.0 { g } else { 0.0 })
                    .collect();
                let want = conv_grads_reference(&x.vals, xs, &w.vals, ws, &passed, &o);
                let ctx = |what: &str| {
                    format!("d{what} of conv2d+bias+relu {xs:?} * {ws:?} {o:?} {dtype} {variant:?} on {device}")
                };
                assert_conv_grads(ctx, &grads, [&xv, &wv, &bv], &want, sum_tol(dtype));
            }
        }
    }
}

fn pool_reference(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    max: bool,
) -> Vec<f64> {
    let oh = (h + 2 * p[0] - k[0]) / s[0] + 1;
    let ow = (w + 2 * p[1] - k[1]) / s[1] + 1;
    let mut out = Vec::new();
    for plane in 0..n * c {
        for y in 0..oh {
            for xo in 0..ow {
                let (mut best, mut sum) = (f64::NEG_INFINITY, 0.0);
                for i in 0..k[0] {
                    for j in 0..k[1] {
                        let iy = (y * s[0] + i) as isize - p[0] as isize;
                        let ix = (xo * s[1] + j) as isize - p[1] as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let v = x[(plane * h + iy as usize) * w + ix as usize];
                        best = best.max(v);
                        sum += v;
                    }
                }
                out.push(if max {
                    best
                } else {
                    sum / (k[0] * k[1]) as f64
                });
            }
        }
    }
    out
}

#[test]
fn pooling_matches_reference() {
    let mut rng = Generator::new(8);
    type PoolCase = ([usize; 4], [usize; 2], [usize; 2], [usize; 2]);
    let cases: [PoolCase; 5] = [
        ([2, 3, 8, 8], [2, 2], [2, 2], [0, 0]),
        ([2, 2, 5, 7], [2, 2], [2, 2], [0, 0]),
        ([1, 2, 7, 9], [3, 3], [2, 2], [1, 1]),
        ([2, 1, 5, 6], [3, 2], [1, 2], [1, 0]),
        ([3, 2, 4, 5], [4, 5], [1, 1], [2, 2]),
    ];
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (k, (xs, kernel, stride, pad)) in cases.into_iter().enumerate() {
                for (v, variant) in VARIANTS.into_iter().enumerate() {
                    if (k + v) % 2 == 1 {
                        continue; // half the (case, variant) pairs keep the run short
                    }
                    let x = input(&mut rng, &xs, dtype, &device, variant, Range::Signed);
                    let ctx = format!(
                        "{xs:?} k{kernel:?} s{stride:?} p{pad:?} {dtype} {variant:?} on {device}"
                    );
                    let got = x.t.max_pool2d(kernel, stride, pad).unwrap();
                    let want = pool_reference(&x.vals, xs, kernel, stride, pad, true);
                    assert_close(&format!("max_pool2d {ctx}"), &values(&got), &want, 0.0);
                    let got = x.t.avg_pool2d(kernel, stride, pad).unwrap();
                    let want: Vec<f64> = pool_reference(&x.vals, xs, kernel, stride, pad, false);
                    assert_close(
                        &format!("avg_pool2d {ctx}"),
                        &values(&got),
                        &want,
                        tol(dtype).max(1e-6),
                    );
                }
            }
            // Global average pooling.
            let x = input(
                &mut rng,
                &[2, 3, 5, 4],
                dtype,
                &device,
                Variant::Transposed,
                Range::Signed,
            );
            let got = x.t.adaptive_avg_pool2d([1, 1]).unwrap();
            assert_eq!(got.dims(), [2, 3, 1, 1]);
            let want = pool_reference(&x.vals, [2, 3, 5, 4], [5, 4], [1, 1], [0, 0], false);
            assert_close(
                &format!("adaptive_avg_pool2d {dtype} on {device}"),
                &values(&got),
                &want,
                tol(dtype).max(1e-6),
            );
        }
    }
}

#[test]
fn max_pool_nan_wins_and_ties_go_to_the_first_tap() {
    let nan = f32::NAN;
    #[rustfmt::skip]
    let vals = vec![
        1., 5., 5., 2.,  0., 7.,
        5., 3., nan, 4., 7., 7.,
        6., 6., 2., 2.,  3., 1.,
        6., 6., 2., nan, 9., 9.,
    ];
    for device in devices() {
        let x = Tensor::from_vec(vals.clone(), [1, 1, 4, 6], &device)
            .unwrap()
            .var()
            .unwrap();
        // Disjoint 2x2 windows (the CPU's fast path), then overlapping 3x3 ones with padding.
        for (kernel, stride, pad) in [([2, 2], [2, 2], [0, 0]), ([3, 3], [1, 2], [1, 1])] {
            let y = x.max_pool2d(kernel, stride, pad).unwrap();
            let got = y.to_vec::<f32>().unwrap();
            // The reference: scan each window in row-major order; a larger value or the
            // first NaN takes the place.
            let [oh, ow] = [y.dims()[2], y.dims()[3]];
            let mut grad = vec![0f32; vals.len()];
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut best: Option<(f32, usize)> = None;
                    for i in 0..kernel[0] {
                        for j in 0..kernel[1] {
                            let iy = (oy * stride[0] + i) as isize - pad[0] as isize;
                            let ix = (ox * stride[1] + j) as isize - pad[1] as isize;
                            if !(0..4).contains(&iy) || !(0..6).contains(&ix) {
                                continue;
                            }
                            let at = iy as usize * 6 + ix as usize;
                            let v = vals[at];
                            let take = match best {
                                None => true,
                                Some((b, _)) => v > b || (v.is_nan() && !b.is_nan()),
                            };
                            if take {
                                best = Some((v, at));
                            }
                        }
                    }
                    let (b, at) = best.unwrap();
                    let g = got[oy * ow + ox];
                    assert!(
                        g == b || (g.is_nan() && b.is_nan()),
                        "max_pool2d k{kernel:?} output ({oy}, {ox}) on {device}: {g} != {b}"
                    );
                    grad[at] += (1 + oy * ow + ox) as f32;
                }
            }
            let w: Vec<f32> = (1..=oh * ow).map(|v| v as f32).collect();
            let w = Tensor::from_vec(w, [1, 1, oh, ow], &device).unwrap();
            let g = y.mul(&w).unwrap().sum(kiln::AllDims, false).unwrap();
            let g = g.backward().unwrap();
            assert_eq!(
                g.get(&x).unwrap().to_vec::<f32>().unwrap(),
                grad,
                "max_pool2d k{kernel:?} gradient on {device}"
            );
        }
    }
}

#[test]
fn max_pool_gradient_goes_to_the_maximum() {
    for device in devices() {
        let x = Tensor::from_vec(
            vec![1f32, 9., 2., 3., 4., 5., 8., 6., 7.],
            [1, 1, 3, 3],
            &device,
        )
        .unwrap()
        .var()
        .unwrap();
        // Overlapping 2x2 windows, stride 1: maxima 9, 9, 8, 7 (x[1] twice).
        let y = x.max_pool2d([2, 2], [1, 1], [0, 0]).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [9., 9., 8., 7.]);
        let w = Tensor::from_vec(vec![1f32, 10., 100., 1000.], [1, 1, 2, 2], &device).unwrap();
        let g = y
            .mul(&w)
            .unwrap()
            .sum(kiln::AllDims, false)
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(
            g.get(&x).unwrap().to_vec::<f32>().unwrap(),
            [0., 11., 0., 0., 0., 0., 100., 0., 1000.],
            "{device}"
        );
    }
}

#[test]
fn batch_norm_matches_reference_and_updates_running_stats() {
    let mut rng = Generator::new(9);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            let shape = [4, 3, 5, 2];
            let x = input(
                &mut rng,
                &shape,
                dtype,
                &device,
                Variant::Narrowed,
                Range::Signed,
            );
            let wv = random_vals(&mut rng, 3, dtype, Range::Signed);
            let bv = random_vals(&mut rng, 3, dtype, Range::Signed);
            let (w, b) = (
                tensor_of(&wv, &[3], dtype, &device),
                tensor_of(&bv, &[3], dtype, &device),
            );
            let rm = Tensor::zeros(3, dtype, &device).unwrap();
            let rv = Tensor::ones(3, dtype, &device).unwrap();
            let running = RunningStats {
                mean: &rm,
                var: &rv,
                momentum: 0.25,
            };
            let y =
                x.t.batch_norm(Some(running), Some(&w), Some(&b), true, 1e-5)
                    .unwrap();
            // Reference: per channel over (n, h, w).
            let per = shape[0] * shape[2] * shape[3];
            let (mut want, mut means, mut vars) = (vec![0.0; x.vals.len()], vec![], vec![]);
            for ch in 0..3 {
                let idx: Vec<usize> = (0..x.vals.len())
                    .filter(|&i| unravel(i, &shape)[1] == ch)
                    .collect();
                let mean = idx.iter().map(|&i| x.vals[i]).sum::<f64>() / per as f64;
                let var = idx.iter().map(|&i| (x.vals[i] - mean).powi(2)).sum::<f64>() / per as f64;
                for &i in &idx {
                    want[i] = (x.vals[i] - mean) / (var + 1e-5).sqrt() * wv[ch] + bv[ch];
                }
                means.push(0.25 * mean);
                vars.push(0.75 + 0.25 * var * per as f64 / (per - 1) as f64);
            }
            let ctx = format!("batch_norm {dtype} on {device}");
            let t = tol(dtype).max(1e-6) * 4.0;
            assert_norm_close(&ctx, &values(&y), &want, t);
            assert_close(&format!("{ctx} running mean"), &values(&rm), &means, t);
            assert_close(&format!("{ctx} running var"), &values(&rv), &vars, t);
            // Evaluation uses the running statistics.
            let running = RunningStats {
                mean: &rm,
                var: &rv,
                momentum: 0.25,
            };
            let e =
                x.t.batch_norm(Some(running), Some(&w), Some(&b), false, 1e-5)
                    .unwrap();
            let want: Vec<f64> = (0..x.vals.len())
                .map(|i| {
                    let ch = unravel(i, &shape)[1];
                    (x.vals[i] - means[ch]) / (vars[ch] + 1e-5).sqrt() * wv[ch] + bv[ch]
                })
                .collect();
            assert_norm_close(&format!("{ctx} eval"), &values(&e), &want, t);
        }
    }
}

#[test]
fn bad_shapes_are_errors_naming_the_op_and_shapes() {
    let d = Device::Cpu;
    let f = |s: &[usize]| Tensor::ones(s, DType::F32, &d).unwrap();
    let o = Conv2dOptions::default();
    let msg = |e: Error| e.to_string();
    // Channel mismatch.
    let e = msg(f(&[1, 3, 8, 8])
        .conv2d(&f(&[4, 2, 3, 3]), None, o)
        .unwrap_err());
    assert!(
        e.contains("conv2d") && e.contains("[1, 3, 8, 8]") && e.contains("[4, 2, 3, 3]"),
        "{e}"
    );
    // Kernel larger than the padded input.
    let e = msg(f(&[1, 1, 4, 4])
        .conv2d(&f(&[1, 1, 5, 5]), None, o)
        .unwrap_err());
    assert!(e.contains("conv2d") && e.contains("padded input"), "{e}");
    assert!(f(&[1, 1, 4, 4])
        .conv2d(&f(&[1, 1, 5, 5]), None, o.padding(1))
        .is_ok());
    // Groups not dividing the channels.
    let e = msg(f(&[1, 4, 8, 8])
        .conv2d(&f(&[6, 2, 3, 3]), None, o.groups(3))
        .unwrap_err());
    assert!(e.contains("groups 3"), "{e}");
    // Bias of the wrong size, 3-D input, zero stride.
    assert!(f(&[1, 2, 8, 8])
        .conv2d(&f(&[4, 2, 3, 3]), Some(&f(&[3])), o)
        .is_err());
    assert!(f(&[2, 8, 8]).conv2d(&f(&[4, 2, 3, 3]), None, o).is_err());
    assert!(f(&[1, 2, 8, 8])
        .conv2d(&f(&[4, 2, 3, 3]), None, o.stride(0))
        .is_err());
    // Integer input, mixed dtypes.
    let i = Tensor::ones([1, 2, 8, 8], DType::I64, &d).unwrap();
    assert!(i.conv2d(&f(&[4, 2, 3, 3]), None, o).is_err());
    assert!(f(&[1, 2, 8, 8])
        .conv2d(
            &Tensor::ones([4, 2, 3, 3], DType::F64, &d).unwrap(),
            None,
            o
        )
        .is_err());
    // Pooling: kernel too large, too much padding.
    let e = msg(f(&[1, 1, 3, 3])
        .max_pool2d([4, 4], [1, 1], [0, 0])
        .unwrap_err());
    assert!(
        e.contains("max_pool2d") && e.contains("[1, 1, 3, 3]"),
        "{e}"
    );
    assert!(f(&[1, 1, 8, 8]).avg_pool2d([2, 2], [2, 2], [2, 2]).is_err());
    assert!(f(&[1, 1, 7, 7]).adaptive_avg_pool2d([2, 2]).is_err());
    // Batch norm: wrong parameter size, one value per channel in training, eval without stats.
    let x = f(&[4, 3, 2, 2]);
    assert!(x
        .batch_norm(None, Some(&f(&[4])), None, true, 1e-5)
        .is_err());
    assert!(f(&[1, 3]).batch_norm(None, None, None, true, 1e-5).is_err());
    assert!(x.batch_norm(None, None, None, false, 1e-5).is_err());
}
