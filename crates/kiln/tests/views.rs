//! The layout algebra: every view is O(1), shares storage, and reads the elements the
//! index mapping predicts. Property tests drive random chains of views.

mod common;
use common::*;
use kiln::{DType, Device, Layout, Tensor};
use proptest::prelude::*;

/// A view op and its effect on a reference index mapping.
#[derive(Clone, Debug)]
enum ViewOp {
    Transpose(usize, usize),
    Permute(Vec<usize>),
    Narrow(usize, usize, usize),
    Slice(usize, usize, usize, usize),
    Unsqueeze(usize),
    Squeeze(usize),
    Broadcast(usize, usize),
    Reshape(Vec<usize>),
}

/// Maps an index of a view to the index of the base tensor it reads.
type IndexMap = Box<dyn Fn(&[usize]) -> Vec<usize>>;

/// The reference model: a view is a function from its index to the base tensor's index.
/// Kept as an explicit list of (shape, map) so each step composes with the previous one.
struct Model {
    shape: Vec<usize>,
    map: IndexMap,
}

impl Model {
    fn apply(self, op: &ViewOp) -> Option<Model> {
        let Model { shape, map } = self;
        let rank = shape.len();
        Some(match op.clone() {
            ViewOp::Transpose(a, b) => {
                let (a, b) = (a % rank.max(1), b % rank.max(1));
                if rank == 0 {
                    return None;
                }
                let mut s = shape.clone();
                s.swap(a, b);
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let mut j = i.to_vec();
                        j.swap(a, b);
                        map(&j)
                    }),
                }
            }
            ViewOp::Permute(p) => {
                if p.len() != rank {
                    return None;
                }
                let s: Vec<usize> = p.iter().map(|&d| shape[d]).collect();
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let mut j = vec![0; i.len()];
                        for (k, &d) in p.iter().enumerate() {
                            j[d] = i[k];
                        }
                        map(&j)
                    }),
                }
            }
            ViewOp::Narrow(d, start, len) => {
                if rank == 0 {
                    return None;
                }
                let d = d % rank;
                let start = start % (shape[d] + 1);
                let len = len % (shape[d] - start + 1);
                let mut s = shape.clone();
                s[d] = len;
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let mut j = i.to_vec();
                        j[d] += start;
                        map(&j)
                    }),
                }
            }
            ViewOp::Slice(d, start, end, step) => {
                if rank == 0 {
                    return None;
                }
                let d = d % rank;
                let start = start % (shape[d] + 1);
                let end = start + end % (shape[d] - start + 1);
                let step = 1 + step % 3;
                let mut s = shape.clone();
                s[d] = (end - start).div_ceil(step);
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let mut j = i.to_vec();
                        j[d] = start + i[d] * step;
                        map(&j)
                    }),
                }
            }
            ViewOp::Unsqueeze(d) => {
                let d = d % (rank + 1);
                let mut s = shape.clone();
                s.insert(d, 1);
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let mut j = i.to_vec();
                        j.remove(d);
                        map(&j)
                    }),
                }
            }
            ViewOp::Squeeze(d) => {
                if rank == 0 {
                    return None;
                }
                let d = d % rank;
                if shape[d] != 1 {
                    return Some(Model { shape, map });
                }
                let mut s = shape.clone();
                s.remove(d);
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let mut j = i.to_vec();
                        j.insert(d, 0);
                        map(&j)
                    }),
                }
            }
            ViewOp::Broadcast(lead, size) => {
                // Prepend `lead % 2` new dims of extent `size`, and expand extent-1 dims to `size`.
                let lead = lead % 2;
                let size = 1 + size % 3;
                let mut s = vec![size; lead];
                s.extend(shape.iter().map(|&d| if d == 1 { size } else { d }));
                let orig = shape.clone();
                Model {
                    shape: s,
                    map: Box::new(move |i| {
                        let j: Vec<usize> = i[lead..]
                            .iter()
                            .zip(&orig)
                            .map(|(&x, &d)| if d == 1 { 0 } else { x })
                            .collect();
                        map(&j)
                    }),
                }
            }
            ViewOp::Reshape(split) => {
                // Reshape to a shape built from the element count: row-major order is kept.
                let n: usize = shape.iter().product();
                let new = reshape_target(n, &split);
                let old = shape.clone();
                Model {
                    shape: new.clone(),
                    map: Box::new(move |i| map(&unravel(ravel(i, &new), &old))),
                }
            }
        })
    }
}

/// A shape with `n` elements built by peeling the factors listed in `split` off `n`.
fn reshape_target(n: usize, split: &[usize]) -> Vec<usize> {
    let mut rest = n;
    let mut s = Vec::new();
    for &f in split {
        let f = 1 + f % 4;
        if rest.is_multiple_of(f) && s.len() < 4 {
            s.push(f);
            rest /= f;
        }
    }
    s.push(rest);
    s
}

fn apply(t: &Tensor, op: &ViewOp) -> Tensor {
    let rank = t.rank();
    match op.clone() {
        ViewOp::Transpose(a, b) => t.transpose(a % rank, b % rank).unwrap(),
        ViewOp::Permute(p) => t.permute(&p).unwrap(),
        ViewOp::Narrow(d, start, len) => {
            let d = d % rank;
            let start = start % (t.dims()[d] + 1);
            t.narrow(d, start, len % (t.dims()[d] - start + 1)).unwrap()
        }
        ViewOp::Slice(d, start, end, step) => {
            let d = d % rank;
            let start = start % (t.dims()[d] + 1);
            let end = start + end % (t.dims()[d] - start + 1);
            t.slice(d, start..end, 1 + step % 3).unwrap()
        }
        ViewOp::Unsqueeze(d) => t.unsqueeze(d % (rank + 1)).unwrap(),
        ViewOp::Squeeze(d) => t.squeeze(d % rank).unwrap(),
        ViewOp::Broadcast(lead, size) => {
            let size = 1 + size % 3;
            let mut s = vec![size; lead % 2];
            s.extend(t.dims().iter().map(|&d| if d == 1 { size } else { d }));
            t.broadcast_as(s).unwrap()
        }
        ViewOp::Reshape(split) => t.reshape(reshape_target(t.elem_count(), &split)).unwrap(),
    }
}

fn view_op(rank_hint: usize) -> impl Strategy<Value = ViewOp> {
    prop_oneof![
        (0..6usize, 0..6usize).prop_map(|(a, b)| ViewOp::Transpose(a, b)),
        Just(rank_hint)
            .prop_flat_map(|r| Just((0..r).collect::<Vec<_>>()).prop_shuffle())
            .prop_map(ViewOp::Permute),
        (0..6usize, 0..8usize, 0..8usize).prop_map(|(d, s, l)| ViewOp::Narrow(d, s, l)),
        (0..6usize, 0..8usize, 0..8usize, 0..3usize)
            .prop_map(|(d, s, e, st)| ViewOp::Slice(d, s, e, st)),
        (0..6usize).prop_map(ViewOp::Unsqueeze),
        (0..6usize).prop_map(ViewOp::Squeeze),
        (0..2usize, 0..3usize).prop_map(|(l, s)| ViewOp::Broadcast(l, s)),
        proptest::collection::vec(0..4usize, 0..3).prop_map(ViewOp::Reshape),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// For any chain of views, element (i, j, ..) read through the view is the element the
    /// composed index mapping predicts.
    #[test]
    fn chains_of_views_read_the_predicted_elements(
        shape in proptest::collection::vec(1..5usize, 1..4),
        ops in proptest::collection::vec(view_op(3), 1..7),
    ) {
        let n: usize = shape.iter().product();
        let base_vals: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
        let base = Tensor::from_vec(base_vals.clone(), &shape[..], &Device::Cpu).unwrap();
        let mut t = base.clone();
        let base_shape = shape.clone();
        let mut model = Model { shape: shape.clone(), map: Box::new(|i| i.to_vec()) };
        for op in &ops {
            if let ViewOp::Permute(p) = op {
                if p.len() != t.rank() { continue; }
            }
            if t.rank() == 0 && !matches!(op, ViewOp::Unsqueeze(_) | ViewOp::Broadcast(..) | ViewOp::Reshape(_)) {
                continue;
            }
            let next = model.apply(op).unwrap();
            t = apply(&t, op);
            model = next;
            prop_assert_eq!(t.dims(), &model.shape[..], "after {:?}", op);
        }
        let got = t.to_vec::<f64>().unwrap();
        let m: usize = model.shape.iter().product();
        for (i, &g) in got.iter().enumerate().take(m) {
            let idx = unravel(i, &model.shape);
            let want = base_vals[ravel(&(model.map)(&idx), &base_shape)];
            prop_assert_eq!(g, want, "element {:?} after {:?}", idx, ops);
            // While the view still shares the base storage (reshape may have copied), the
            // layout's own offset arithmetic agrees too.
            if t.same_storage(&base) {
                prop_assert_eq!(base_vals[t.layout().offset_of(&idx)], want);
            }
        }
    }

    /// Layout::reshape_view, when it succeeds, addresses the same elements in row-major order.
    #[test]
    fn reshape_view_preserves_row_major_order(
        shape in proptest::collection::vec(1..5usize, 1..4),
        perm_seed in 0..6usize,
        split in proptest::collection::vec(0..4usize, 0..3),
    ) {
        let rank = shape.len();
        let l = Layout::contiguous(&shape[..]).transpose(perm_seed % rank, (perm_seed / 2) % rank).unwrap();
        let target = reshape_target(l.elem_count(), &split);
        if let Some(v) = l.reshape_view(&target.clone().into()) {
            let a: Vec<usize> = l.offsets().collect();
            let b: Vec<usize> = v.offsets().collect();
            prop_assert_eq!(a, b);
        }
    }
}

#[test]
fn views_share_storage_and_copy_nothing() {
    let t = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &Device::Cpu)
        .unwrap()
        .reshape([2, 3, 4])
        .unwrap();
    let views = [
        t.transpose(0, 2).unwrap(),
        t.t().unwrap(),
        t.permute(&[2, 0, 1]).unwrap(),
        t.narrow(1, 1, 2).unwrap(),
        t.slice(2, 0..4, 2).unwrap(),
        t.unsqueeze(0).unwrap().broadcast_as([5, 2, 3, 4]).unwrap(),
        t.expand([7, 2, 3, 4]).unwrap(),
        t.unsqueeze(-1).unwrap(),
        t.narrow(0, 0, 1).unwrap().squeeze(0).unwrap(),
        t.reshape([6, 4]).unwrap(),
        t.view([4, 6]).unwrap(),
        t.flatten(0, 1).unwrap(),
        t.flatten_all().unwrap(),
        t.select(1, 2).unwrap(),
        t.contiguous().unwrap(),
    ];
    for v in &views {
        assert!(v.same_storage(&t), "{v:?} copied");
    }
    let tr = t.t().unwrap();
    assert!(!tr.is_contiguous());
    assert!(
        !tr.contiguous().unwrap().same_storage(&t),
        "contiguous() of a transposed view must copy"
    );
    assert!(tr.contiguous().unwrap().is_contiguous());
}

#[test]
fn reshape_copies_only_when_strides_forbid_a_view() {
    let t = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &Device::Cpu)
        .unwrap()
        .reshape([3, 4])
        .unwrap();
    let tr = t.t().unwrap(); // [4, 3], strides [1, 4]
    let r = tr.reshape([12]).unwrap();
    assert!(!r.same_storage(&t));
    assert_eq!(
        r.to_vec::<f32>().unwrap(),
        vec![0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]
    );
    assert!(tr.view([12]).is_err());
    // Splitting a dim of a transposed view is still a view.
    let split = tr.reshape([2, 2, 3]).unwrap();
    assert!(split.same_storage(&t));
    assert_eq!(split.to_vec::<f32>().unwrap(), tr.to_vec::<f32>().unwrap());
}

#[test]
fn views_on_every_device_read_the_right_values() {
    for device in devices() {
        let vals: Vec<f64> = (0..24).map(|i| i as f64).collect();
        let t = tensor_of(&vals, &[2, 3, 4], DType::F32, &device);
        let v = t
            .permute(&[2, 0, 1])
            .unwrap()
            .narrow(0, 1, 2)
            .unwrap()
            .slice(2, 0..3, 2)
            .unwrap();
        // v[i, j, k] = t[j, 2k, 1 + i]
        let mut want = vec![];
        for i in 0..2 {
            for j in 0..2 {
                for k in 0..2 {
                    want.push(vals[j * 12 + 2 * k * 4 + 1 + i]);
                }
            }
        }
        assert_eq!(values(&v), want, "{device}");
    }
}

#[test]
fn copies_hold_every_element_at_every_size_and_dtype() {
    // Sizes on both sides of the CPU's split points: one thread, two halves through the
    // hot helper, and per-thread chunks through the pool; a contiguous range that starts
    // past the storage's first element; and a transposed (strided) source.
    let mut rng = kiln::Generator::new(31);
    for device in devices() {
        for dtype in DType::ALL {
            if !supports(&device, dtype) {
                continue;
            }
            for n in [1usize, 1000, 70_000, 1_100_000] {
                let vals = random_vals(&mut rng, n + 3, dtype, Range::Signed);
                let base = tensor_of(&vals, &[n + 3], dtype, &device);
                let ctx = format!("{dtype} {n} on {device}");
                let whole = base.copy().unwrap();
                assert_eq!(values(&whole), vals, "copy of {ctx}");
                let inner = base.narrow(0, 2, n).unwrap();
                assert_eq!(
                    values(&inner.copy().unwrap()),
                    vals[2..2 + n],
                    "narrowed {ctx}"
                );
            }
            let vals = random_vals(&mut rng, 300 * 257, dtype, Range::Signed);
            let t = tensor_of(&vals, &[300, 257], dtype, &device).t().unwrap();
            let want: Vec<f64> = (0..257)
                .flat_map(|j| (0..300).map(move |i| (i, j)))
                .map(|(i, j)| vals[i * 257 + j])
                .collect();
            assert_eq!(
                values(&t.copy().unwrap()),
                want,
                "transposed {dtype} on {device}"
            );
        }
    }
}

/// Copies of transposed views, which the CPU moves in 16×16 tiles (a register transpose for
/// 4-byte types on AVX-512): whole and partial tiles, batches of transposes, narrowed
/// sources, a copy large enough to be split across threads, and a permutation the tiles do
/// not apply to; every dtype, against the layout's own offsets.
#[test]
fn transposed_copies_hold_every_element() {
    let mut rng = kiln::Generator::new(57);
    type View = fn(&Tensor) -> kiln::Result<Tensor>;
    let cases: [(&[usize], View); 8] = [
        (&[16, 16], |t| t.t()),
        (&[32, 48], |t| t.t()),
        (&[17, 35], |t| t.t()),
        (&[1030, 70], |t| t.t()),
        (&[5, 37, 21], |t| t.transpose(1, 2)),
        (&[3, 40, 50], |t| {
            t.narrow(2, 3, 40)?.narrow(1, 1, 33)?.transpose(1, 2)
        }),
        (&[4, 18, 19], |t| t.permute(&[2, 0, 1])),
        (&[2, 20, 3, 18], |t| t.permute(&[0, 2, 3, 1])),
    ];
    for device in devices() {
        for dtype in DType::ALL {
            if !supports(&device, dtype) {
                continue;
            }
            for (shape, view) in cases {
                let n: usize = shape.iter().product();
                let vals = random_vals(&mut rng, n, dtype, Range::Signed);
                let base = tensor_of(&vals, shape, dtype, &device);
                let v = view(&base).unwrap();
                let want: Vec<f64> = v.layout().offsets().map(|o| vals[o]).collect();
                assert_eq!(
                    values(&v.copy().unwrap()),
                    want,
                    "{dtype} {shape:?} viewed as {:?} (strides {:?}) on {device}",
                    v.dims(),
                    v.strides()
                );
            }
        }
    }
}
