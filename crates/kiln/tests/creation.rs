//! Constructors, random tensors, reading back, Display, records of plain data, threads.

mod common;
use common::*;
use kiln::{DType, Device, Generator, Tensor};

#[test]
fn constants_ranges_and_identity() {
    for device in devices() {
        for dtype in DType::ALL {
            if !supports(&device, dtype) {
                continue;
            }
            let z = Tensor::zeros([2, 3], dtype, &device).unwrap();
            assert_eq!(
                (z.dims(), z.dtype(), z.device()),
                (&[2, 3][..], dtype, device)
            );
            assert_eq!(values(&z), vec![0.0; 6]);
            assert_eq!(
                values(&Tensor::ones(4, dtype, &device).unwrap()),
                vec![1.0; 4]
            );
            assert_eq!(
                values(&Tensor::full(7.0, [2, 2], dtype, &device).unwrap()),
                vec![7.0; 4]
            );
            assert_eq!(
                values(&Tensor::arange(2.0, 7.0, 2.0, dtype, &device).unwrap()),
                vec![2.0, 4.0, 6.0]
            );
            let eye = Tensor::eye(3, dtype, &device).unwrap();
            assert_eq!(
                values(&eye),
                vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
            );
            let x = input(
                &mut Generator::new(1),
                &[3, 2],
                dtype,
                &device,
                Variant::Transposed,
                Range::Signed,
            );
            assert_eq!(values(&x.t.zeros_like().unwrap()), vec![0.0; 6]);
            assert_eq!(values(&x.t.full_like(3.0).unwrap()), vec![3.0; 6]);
            assert_eq!(Tensor::scalar(5.0, dtype, &device).unwrap().rank(), 0);
        }
    }
}

#[test]
fn random_tensors_are_seeded_and_distributed() {
    for device in devices() {
        let n = 20_000;
        let dt = if supports(&device, DType::F64) {
            DType::F64
        } else {
            DType::F32
        };
        let a = Tensor::randn(n, 1.0, 2.0, dt, &device, &mut Generator::new(7)).unwrap();
        let b = Tensor::randn(n, 1.0, 2.0, dt, &device, &mut Generator::new(7)).unwrap();
        let c = Tensor::randn(n, 1.0, 2.0, dt, &device, &mut Generator::new(8)).unwrap();
        let (va, vb, vc) = (values(&a), values(&b), values(&c));
        assert_eq!(va, vb, "same seed, same tensor");
        assert_ne!(va, vc, "different seeds differ");
        let mean = va.iter().sum::<f64>() / n as f64;
        let var = va.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (mean - 1.0).abs() < 0.05 && (var.sqrt() - 2.0).abs() < 0.05,
            "mean {mean} std {}",
            var.sqrt()
        );
        let u = values(
            &Tensor::rand(n, -1.0, 3.0, DType::F32, &device, &mut Generator::new(9)).unwrap(),
        );
        assert!(u.iter().all(|&v| (-1.0..3.0).contains(&v)));
        let um = u.iter().sum::<f64>() / n as f64;
        assert!((um - 1.0).abs() < 0.05, "uniform mean {um}");
    }
}

#[test]
fn from_vec_to_vec_round_trip_and_scalars() {
    let d = Device::Cpu;
    let t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], [3, 2], &d).unwrap();
    assert_eq!(
        t.to_vec2::<u8>().unwrap(),
        vec![vec![1, 2], vec![3, 4], vec![5, 6]]
    );
    assert_eq!(
        t.t().unwrap().to_vec::<u8>().unwrap(),
        vec![1, 3, 5, 2, 4, 6]
    );
    assert_eq!(
        t.narrow(0, 2, 1)
            .unwrap()
            .narrow(1, 1, 1)
            .unwrap()
            .to_scalar::<u8>()
            .unwrap(),
        6
    );
    assert_eq!(
        t.to_device(&d).unwrap().to_vec::<u8>().unwrap(),
        t.to_vec::<u8>().unwrap()
    );
    let h = Tensor::from_vec(vec![kiln::bf16::from_f32(1.5)], (), &d).unwrap();
    assert_eq!(h.to_scalar::<kiln::bf16>().unwrap().to_f32(), 1.5);
}

#[test]
fn display_is_readable_and_summarised() {
    let d = Device::Cpu;
    let t = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 4.0], [2, 2], &d).unwrap();
    let s = t.to_string();
    assert!(
        s.contains("[[ 1.5000, -2.0000],") && s.contains("[ 3.2500,  4.0000]]"),
        "{s}"
    );
    assert!(
        s.contains("dtype=f32") && s.contains("device=cpu") && s.contains("shape=[2, 2]"),
        "{s}"
    );
    let i = Tensor::arange(0.0, 3.0, 1.0, DType::I64, &d)
        .unwrap()
        .to_string();
    assert!(i.contains("[0, 1, 2]"), "{i}");
    let big = Tensor::arange(0.0, 5000.0, 1.0, DType::F32, &d)
        .unwrap()
        .reshape([50, 100])
        .unwrap()
        .to_string();
    assert!(
        big.contains("...") && big.contains("4999.0000") && big.len() < 2000,
        "{big}"
    );
    assert!(Tensor::scalar(2.0, DType::F64, &d)
        .unwrap()
        .to_string()
        .starts_with("tensor(2.0000"));
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Particle {
    pos: [f32; 3],
    mass: f32,
}

#[test]
fn records_round_trip_without_copying() {
    let ps: Vec<Particle> = (0..5)
        .map(|i| Particle {
            pos: [i as f32, 1.0, 2.0],
            mass: 10.0 + i as f32,
        })
        .collect();
    let owned = ps.clone();
    let ptr = owned.as_ptr() as usize;
    let t = Tensor::from_records::<Particle, f32>(owned).unwrap();
    assert_eq!(t.dims(), &[5, 4]);
    assert_eq!(
        t.select(1, 3).unwrap().to_vec::<f32>().unwrap(),
        vec![10., 11., 12., 13., 14.]
    );
    let back = t.records::<Particle, f32>().unwrap();
    assert_eq!(
        back.as_ptr() as usize,
        ptr,
        "records() must borrow the original allocation"
    );
    assert_eq!(&back[..], &ps[..]);
    drop(back);
    // A narrowed (but contiguous) block of rows is also viewable.
    let rows = t.narrow(0, 2, 2).unwrap();
    assert_eq!(rows.records::<Particle, f32>().unwrap()[0], ps[2]);
    // Wrong layouts and types are errors.
    assert!(t.t().unwrap().records::<Particle, f32>().is_err());
    assert!(t.records::<Particle, f64>().is_err());
    assert!(t
        .narrow(1, 0, 3)
        .unwrap()
        .records::<Particle, f32>()
        .is_err());
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Odd {
        a: [u8; 3],
    }
    assert!(Tensor::from_records::<Odd, f32>(vec![Odd { a: [1, 2, 3] }]).is_err());
}

#[test]
fn thread_count_is_settable_and_results_do_not_depend_on_it() {
    let mut rng = Generator::new(3);
    let a = Tensor::randn([300, 200], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let b = Tensor::randn([200, 100], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let big = Tensor::randn([1 << 17], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    kiln::set_num_threads(1).unwrap();
    assert_eq!(kiln::num_threads(), 1);
    let one = (
        a.matmul(&b).unwrap().to_vec::<f32>().unwrap(),
        big.exp().unwrap().to_vec::<f32>().unwrap(),
    );
    kiln::set_num_threads(2).unwrap();
    assert_eq!(kiln::num_threads(), 2);
    let two = (
        a.matmul(&b).unwrap().to_vec::<f32>().unwrap(),
        big.exp().unwrap().to_vec::<f32>().unwrap(),
    );
    kiln::set_num_threads(0).unwrap();
    assert_eq!(one.1, two.1);
    let err = one
        .0
        .iter()
        .zip(&two.0)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(err < 1e-3, "matmul differs by {err} between thread counts");
}
