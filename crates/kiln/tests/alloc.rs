//! Views allocate no heap memory for tensors of up to `kiln::INLINE_DIMS` dimensions (their
//! layout lives inline), checked with a counting global allocator.

use kiln::{DType, Device, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;
thread_local! {
    // Per thread, so tests running in parallel do not count each other's allocations.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

#[test]
fn views_of_up_to_inline_dims_do_not_allocate() {
    let max = kiln::INLINE_DIMS;
    assert!(max >= 4, "NCHW views must stay inline");
    for rank in 2..=max {
        let shape: Vec<usize> = (0..rank).map(|i| 2 + i % 2).collect();
        let t = Tensor::zeros(&shape[..], DType::F32, &Device::Cpu).unwrap();
        let n = allocations_during(|| {
            let a = t.transpose(0, rank - 1).unwrap();
            let b = a.t().unwrap();
            let c = b.narrow(0, 0, 1).unwrap();
            let d = c.slice(1, 0..2, 2).unwrap();
            // Unsqueeze only while the result stays inline.
            let e = if rank < max {
                d.unsqueeze(0).unwrap()
            } else {
                d.squeeze(0).unwrap()
            };
            let f = t.squeeze(0).unwrap();
            let g = t.transpose(1, 0).unwrap();
            let h = t.broadcast_as(&shape[..]).unwrap();
            let i = t.is_contiguous() && !a.is_contiguous();
            std::hint::black_box((a, b, c, d, e, f, g, h, i));
        });
        assert_eq!(n, 0, "rank {rank}: views allocated {n} times");
    }
}

#[test]
fn the_counter_sees_allocations() {
    // The check above cannot pass vacuously: a real op is counted.
    let t = Tensor::zeros([4, 4], DType::F32, &Device::Cpu).unwrap();
    assert!(
        allocations_during(|| drop(t.contiguous().unwrap().t().unwrap().contiguous().unwrap())) > 0
    );
}
