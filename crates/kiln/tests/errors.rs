//! Bad input gets an error naming the op and the offending shapes, dtypes, devices or
//! indices; never a panic.

use kiln::{DType, Device, Error, Tensor};

fn f32s(shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(
        (0..n).map(|i| i as f32 + 1.0).collect::<Vec<_>>(),
        shape,
        &Device::Cpu,
    )
    .unwrap()
}

fn message(r: kiln::Result<Tensor>) -> (Error, String) {
    let e = r.expect_err("expected an error");
    let m = e.to_string();
    (e, m)
}

#[test]
fn shape_errors_name_op_and_shapes() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4, 3]));
    let (e, m) = message(a.add(&b));
    assert!(
        matches!(e, Error::BroadcastIncompatible { op: "add", .. }),
        "{e:?}"
    );
    assert!(
        m.contains("add") && m.contains("[2, 3]") && m.contains("[4, 3]"),
        "{m}"
    );

    let (e, m) = message(a.matmul(&f32s(&[2, 3])));
    assert!(matches!(e, Error::MatmulShape { .. }), "{e:?}");
    assert!(m.contains("[2, 3]") && m.contains("inner"), "{m}");
    assert!(matches!(
        f32s(&[2, 2, 3]).matmul(&f32s(&[3, 3, 1])),
        Err(Error::MatmulShape { .. })
    ));
    assert!(matches!(
        f32s(&[]).matmul(&f32s(&[3])),
        Err(Error::MatmulShape { .. })
    ));

    let (e, m) = message(a.reshape([4, 2]));
    assert!(
        matches!(e, Error::ElementCountMismatch { op: "reshape", .. }),
        "{e:?}"
    );
    assert!(m.contains("[4, 2]"), "{m}");
    assert!(matches!(
        Tensor::from_vec(vec![1f32; 5], [2, 3], &Device::Cpu),
        Err(Error::ElementCountMismatch { .. })
    ));
    assert!(matches!(
        Tensor::cat(&[&a, &f32s(&[2, 4])], 0),
        Err(Error::ShapeMismatch { op: "cat", .. })
    ));
    assert!(matches!(
        Tensor::stack(&[&a, &b], 0),
        Err(Error::ShapeMismatch { op: "stack", .. })
    ));
    assert!(Tensor::cat(&[], 0).is_err());
    assert!(matches!(
        a.broadcast_as([3, 3]),
        Err(Error::BroadcastIncompatible {
            op: "broadcast_as",
            ..
        })
    ));
    assert!(a.broadcast_as([3]).is_err());
}

#[test]
fn dim_and_range_errors() {
    let a = f32s(&[2, 3]);
    for r in [
        a.transpose(0, 2),
        a.narrow(2, 0, 1),
        a.sum(5, false),
        a.softmax(-3),
        a.unsqueeze(4),
        a.squeeze(2),
        a.argmax(2, false),
    ] {
        assert!(matches!(r, Err(Error::DimOutOfRange { .. })), "{r:?}");
    }
    let (e, m) = message(a.narrow(1, 2, 5));
    assert!(
        matches!(
            e,
            Error::RangeOutOfBounds {
                op: "narrow",
                dim: 1,
                size: 3,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(m.contains("narrow") && m.contains("2..7"), "{m}");
    assert!(matches!(
        a.slice(0, 1..3, 1),
        Err(Error::RangeOutOfBounds { op: "slice", .. })
    ));
    assert!(a.slice(0, 0..2, 0).is_err(), "step 0");
    assert!(a.permute(&[0, 0]).is_err());
    assert!(a.permute(&[1]).is_err());
    assert!(a.sum([0, 0], false).is_err(), "duplicate dims");
    assert!(a.flatten(1, 0).is_err());
    assert!(matches!(
        a.select(0, 2),
        Err(Error::IndexOutOfRange { op: "select", .. })
    ));
    assert!(f32s(&[3]).t().is_err());
    assert!(f32s(&[0, 3]).max(0, false).is_err(), "max of an empty dim");
    assert!(a.to_scalar::<f32>().is_err());
    assert!(a.to_vec2::<f32>().is_ok() && f32s(&[2]).to_vec2::<f32>().is_err());
}

#[test]
fn dtype_errors_name_both_dtypes() {
    let a = f32s(&[3]);
    let b = a.to_dtype(DType::F64).unwrap();
    let (e, m) = message(a.add(&b));
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                op: "add",
                lhs: DType::F32,
                rhs: DType::F64
            }
        ),
        "{e:?}"
    );
    assert!(m.contains("f32") && m.contains("f64"), "{m}");
    assert!(matches!(
        a.matmul(&b.reshape([3, 1]).unwrap()),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        a.to_vec::<f64>(),
        Err(Error::DTypeMismatch { op: "to_vec", .. })
    ));
    assert!(matches!(
        a.where_cond(&a, &b),
        Err(Error::DTypeMismatch {
            op: "where_cond",
            ..
        })
    ));
    let ints = a.to_dtype(DType::I64).unwrap();
    assert!(matches!(
        ints.matmul(&ints),
        Err(Error::UnsupportedDType { op: "matmul", .. })
    ));
    assert!(matches!(
        a.index_select(&a, 0),
        Err(Error::UnsupportedDType {
            op: "index_select",
            ..
        })
    ));
    assert!(matches!(
        ints.pow(&ints),
        Err(Error::UnsupportedDType { op: "pow", .. })
    ));
}

#[test]
fn index_errors_name_the_index() {
    let a = f32s(&[2, 3]);
    let ids = Tensor::from_vec(vec![0i64, 3], 2, &Device::Cpu).unwrap();
    let (e, m) = message(a.index_select(&ids, 1));
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                op: "index_select",
                index: 3,
                size: 3,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(m.contains("index 3"), "{m}");
    let neg = Tensor::from_vec(vec![-1i64], 1, &Device::Cpu).unwrap();
    assert!(matches!(
        a.index_select(&neg, 0),
        Err(Error::IndexOutOfRange { index: -1, .. })
    ));
    let g = Tensor::from_vec(vec![0i64, 5], [2, 1], &Device::Cpu).unwrap();
    assert!(matches!(
        a.gather(&g, 1),
        Err(Error::IndexOutOfRange { op: "gather", .. })
    ));
    let src = f32s(&[2, 1]);
    assert!(matches!(
        a.scatter_add(&g, &src, 1),
        Err(Error::IndexOutOfRange {
            op: "scatter_add",
            ..
        })
    ));
    let big = Tensor::from_vec(vec![0i64; 8], [2, 4], &Device::Cpu).unwrap();
    assert!(matches!(
        a.gather(&big, 0),
        Err(Error::ShapeMismatch { op: "gather", .. })
    ));
    let two_d = Tensor::from_vec(vec![0i64; 2], [1, 2], &Device::Cpu).unwrap();
    assert!(a.index_select(&two_d, 0).is_err());
}

#[test]
fn device_errors_are_clear() {
    // Until the CUDA backend exists (or when no GPU is present), a CUDA tensor is an error
    // that names the device; where CUDA works, mixing devices is an error naming both.
    let a = f32s(&[3]);
    match a.to_device(&Device::Cuda(0)) {
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::DeviceUnavailable {
                        device: Device::Cuda(0),
                        ..
                    }
                ),
                "{e:?}"
            );
            assert!(e.to_string().contains("cuda:0"), "{e}");
        }
        Ok(g) => {
            let (e, m) = message(a.add(&g));
            assert!(
                matches!(
                    e,
                    Error::DeviceMismatch {
                        op: "add",
                        lhs: Device::Cpu,
                        rhs: Device::Cuda(0)
                    }
                ),
                "{e:?}"
            );
            assert!(m.contains("cpu") && m.contains("cuda:0"), "{m}");
            assert!(matches!(a.matmul(&g), Err(Error::DeviceMismatch { .. })));
        }
    }
    assert!(Tensor::zeros(3, DType::F32, &Device::Cuda(99)).is_err());
    assert!(Device::parse("tpu").is_err());
    assert_eq!(Device::parse("cuda:2").unwrap(), Device::Cuda(2));
}

#[test]
fn bad_creation_arguments() {
    assert!(Tensor::arange(0.0, 1.0, 0.0, DType::F32, &Device::Cpu).is_err());
    assert!(Tensor::arange(0.0, f64::NAN, 1.0, DType::F32, &Device::Cpu).is_err());
    assert_eq!(
        Tensor::arange(3.0, 0.0, -1.0, DType::I64, &Device::Cpu)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![3, 2, 1]
    );
    assert_eq!(
        Tensor::arange(3.0, 0.0, 1.0, DType::F32, &Device::Cpu)
            .unwrap()
            .elem_count(),
        0
    );
    assert!(
        kiln::Layout::new([2, 2].into(), vec![2, 1], 1, 4).is_err(),
        "layout past the storage"
    );
    assert!(
        kiln::Layout::new([2, 2].into(), vec![2], 0, 4).is_err(),
        "stride count"
    );
}
