//! Element-wise ops driven by slice kernels: the kernel sees contiguous runs (a whole
//! contiguous tensor, each row of a strided one, or a gathered stack of a strided row) and
//! writes a contiguous output; threads split the output above the work grain.

use super::hot_helper::{run_split, share};
use super::simd::kernels::STAGE;
use super::strided::RowPlan;
use super::threads::{install, parallel_split, shares_with_helper, splits_in_two, wakes_helper};
use crate::layout::Layout;
use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Runs `f(first_element, chunk)` over `dst` (an output, or an operand updated in place)
/// split into chunks of whole multiples of `unit` elements (a row length), across threads
/// when `dst.len() * cost` is at least the hot helper's grain:
/// - below the pool's grain, in two halves, the second offered to the hot helper (at worst
///   the caller runs both, as it would without it);
/// - where the pool would make two tasks, shared with the hot helper in chunks
///   ([`shared_chunks`]) when `helper_above_grain`;
/// - otherwise one chunk per pool thread, the caller taking the first.
pub(super) fn split_output<E: Send>(
    dst: &mut [E],
    cost: usize,
    unit: usize,
    helper_above_grain: bool,
    f: impl Fn(usize, &mut [E]) + Sync,
) {
    let n = dst.len();
    let unit = unit.max(1);
    let tasks = parallel_split(n, cost).min(n / unit);
    if tasks <= 1 {
        if n / unit < 2 || !splits_in_two(n, cost) {
            f(0, dst);
            return;
        }
        let per = (n / unit).div_ceil(2) * unit;
        let (head, tail) = dst.split_at_mut(per);
        let tail = Mutex::new(Some(tail));
        let f = &f;
        run_split(|| f(0, head), &|| {
            let taken = tail.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(c) = taken {
                f(per, c);
            }
        });
        return;
    }
    // Two-input maps once measured faster through the pool (a 1M-element add 171-187 GB/s
    // against 129-131 through the helper; Zen 5), but on the Zen 4 hosts since, through the
    // helper the 1M-element ReLU and add reach the hardware's floor (session 37), and halves
    // through the pool ran at one thread's rate in whole processes (session 54).
    if tasks == 2 && helper_above_grain && shares_with_helper(n, cost) {
        shared_chunks(dst, cost, unit, wakes_helper(n, cost), &f);
        return;
    }
    let per = (n / unit).div_ceil(tasks) * unit;
    // The calling thread takes the first chunk and hands only the others to the pool: one
    // worker wake per extra chunk, and no thread idles while the work runs.
    let f = &f;
    install(|| {
        rayon::in_place_scope(|s| {
            let mut chunks = dst.chunks_mut(per).enumerate();
            let first = chunks.next();
            for (i, c) in chunks {
                s.spawn(move |_| f(i * per, c));
            }
            if let Some((_, c)) = first {
                f(0, c);
            }
        })
    });
}

/// How many chunks a split shared with the hot helper of `work` copy-equivalent elements
/// is cut into: one per 256K (15–50 µs on one thread), at least 2 and at most 16. Enough that
/// a helper starting late still takes close to half, few enough that each is a long stream.
pub(super) fn share_chunks(work: usize) -> usize {
    (work >> 18).clamp(2, 16)
}

/// `f(first_element, chunk)` over `dst` (of relative cost `cost` an element) in chunks of
/// whole `unit`s ([`share_chunks`]), taken by this thread from the front and by the hot
/// helper from the back (`hot_helper::share`; `wake`: wake it if it sleeps).
pub(super) fn shared_chunks<E: Send>(
    dst: &mut [E],
    cost: usize,
    unit: usize,
    wake: bool,
    f: &(impl Fn(usize, &mut [E]) + Sync),
) {
    let rows = dst.len() / unit.max(1);
    let chunks = share_chunks(dst.len().saturating_mul(cost.max(1)));
    let per = rows.div_ceil(rows.clamp(1, chunks)) * unit.max(1);
    share_chunks_mut(dst, per, wake, &|i, c| f(i * per, c));
}

/// `f(index, chunk)` for every chunk of `chunk_len` elements of `dst`, each taken once by
/// this thread (from the front) or the hot helper (from the back; `hot_helper::share`).
fn share_chunks_mut<E: Send>(
    dst: &mut [E],
    chunk_len: usize,
    wake: bool,
    f: &(impl Fn(usize, &mut [E]) + Sync),
) {
    let parts: Vec<Mutex<Option<&mut [E]>>> = dst
        .chunks_mut(chunk_len)
        .map(|c| Mutex::new(Some(c)))
        .collect();
    share(
        parts.len(),
        &|i| {
            let part = parts[i].lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(c) = part {
                f(i, c);
            }
        },
        wake,
    );
}

/// `f(index, chunk)` for every chunk of `chunk_len` elements of `dst` (the last may be
/// shorter), across threads: with two threads, shared between the caller and the hot helper
/// ([`share`], the helper woken), else on the pool (so with fewer than two chunks, or more
/// than two threads, a task may itself use the pool). For tasks long enough to pay for a
/// wake-up (runs of images of a convolution).
pub(crate) fn for_each_chunk_mut<E: Send>(
    dst: &mut [E],
    chunk_len: usize,
    f: impl Fn(usize, &mut [E]) + Sync,
) {
    let chunk_len = chunk_len.max(1);
    let n_chunks = dst.len().div_ceil(chunk_len);
    if n_chunks >= 2 && super::threads::num_threads() == 2 && shares_with_helper(usize::MAX, 1) {
        share_chunks_mut(dst, chunk_len, true, &f);
        return;
    }
    use rayon::prelude::*;
    install(|| {
        dst.par_chunks_mut(chunk_len)
            .enumerate()
            .for_each(|(i, c)| f(i, c))
    });
}

/// A new vector of `n` elements, every one written by `fill`.
fn collect_with<O>(n: usize, fill: impl FnOnce(&mut [MaybeUninit<O>])) -> Vec<O> {
    let mut out: Vec<O> = super::host_memory::with_capacity_huge(n);
    fill(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: `fill` is one of this file's drivers, which hand every element of the slice
    // to a kernel exactly once, and kernels write every element of the `dst` they get.
    unsafe { out.set_len(n) };
    out
}

/// A transposed operand (`RowPlan::transposed_operand`) copied out in tiles
/// (`strided::copied`), with its contiguous layout. Gathered along each row instead, every
/// element costs a cache line, and a square matrix's columns, a power of two of bytes apart,
/// evict each other: `a + b.t()` of 4096² f32 took 55–66 ms (PyTorch 82), about 23 cycles an
/// element on one core.
fn contiguous_copy<T: bytemuck::Pod + Send + Sync>(x: &[T], l: &Layout) -> (Vec<T>, Layout) {
    let any = x[l.offset()];
    (
        super::strided::copied(x, l, any),
        Layout::contiguous(l.shape().clone()),
    )
}

/// `kernel(src, dst)` over `a` at layout `la`, into a new contiguous vector. `cost` is the
/// op's relative cost per element (1 for a copy).
pub(crate) fn map_kernel1<A: bytemuck::Pod + Send + Sync, O: Send>(
    a: &[A],
    la: &Layout,
    cost: usize,
    kernel: impl Fn(&[A], &mut [MaybeUninit<O>]) + Sync,
) -> Vec<O> {
    let n = la.elem_count();
    if let Some(r) = la.contiguous_range() {
        let src = &a[r];
        return collect_with(n, |dst| {
            split_output(dst, cost, 64, true, |start, d| {
                kernel(&src[start..start + d.len()], d)
            })
        });
    }
    let plan = RowPlan::new([la]);
    if plan.transposed_operand().is_some() {
        let (c, cl) = contiguous_copy(a, la);
        return map_kernel1(&c, &cl, cost, kernel);
    }
    let (len, [sa]) = (plan.row_len, plan.row_strides);
    collect_with(n, |dst| {
        split_output(dst, cost, len, true, |first, chunk| {
            let first_row = first / len.max(1);
            let rows = first_row..first_row + chunk.len() / len.max(1);
            let mut buf = Vec::with_capacity(STAGE.min(len));
            plan.for_rows(rows, |r, [oa]| {
                let d = &mut chunk[(r - first_row) * len..][..len];
                if sa == 1 {
                    return kernel(&a[oa..oa + len], d);
                }
                for (j, dc) in d.chunks_mut(STAGE).enumerate() {
                    let o = oa + j * STAGE * sa;
                    buf.clear();
                    buf.extend((0..dc.len()).map(|i| a[o + i * sa]));
                    kernel(&buf, dc);
                }
            });
        })
    })
}

/// `kernel(a, b, dst)` over two layouts of one shape (broadcast views included), into a new
/// contiguous vector.
pub(crate) fn map_kernel2<
    A: bytemuck::Pod + Send + Sync,
    B: bytemuck::Pod + Send + Sync,
    O: Send,
>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    cost: usize,
    kernel: impl Fn(&[A], &[B], &mut [MaybeUninit<O>]) + Sync,
) -> Vec<O> {
    let n = la.elem_count();
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        return collect_with(n, |dst| {
            split_output(dst, cost, 64, true, |s, d| {
                kernel(&a[s..s + d.len()], &b[s..s + d.len()], d)
            })
        });
    }
    let plan = RowPlan::new([la, lb]);
    match plan.transposed_operand() {
        Some(0) => {
            let (c, cl) = contiguous_copy(a, la);
            return map_kernel2((&c, &cl), (b, lb), cost, kernel);
        }
        Some(_) => {
            let (c, cl) = contiguous_copy(b, lb);
            return map_kernel2((a, la), (&c, &cl), cost, kernel);
        }
        None => {}
    }
    let (len, [sa, sb]) = (plan.row_len, plan.row_strides);
    collect_with(n, |dst| {
        split_output(dst, cost, len, false, |first, chunk| {
            let first_row = first / len.max(1);
            let rows = first_row..first_row + chunk.len() / len.max(1);
            let (mut ba, mut bb) = (Vec::new(), Vec::new());
            plan.for_rows(rows, |r, [oa, ob]| {
                let d = &mut chunk[(r - first_row) * len..][..len];
                if sa == 1 && sb == 1 {
                    return kernel(&a[oa..oa + len], &b[ob..ob + len], d);
                }
                // A broadcast operand (stride 0) is one value per row: fill its stage once.
                if sa == 0 {
                    ba.clear();
                    ba.resize(STAGE.min(len), a[oa]);
                }
                if sb == 0 {
                    bb.clear();
                    bb.resize(STAGE.min(len), b[ob]);
                }
                for (j, dc) in d.chunks_mut(STAGE).enumerate() {
                    let (start, m) = (j * STAGE, dc.len());
                    let xa: &[A] = match sa {
                        0 => &ba[..m],
                        1 => &a[oa + start..oa + start + m],
                        _ => {
                            ba.clear();
                            ba.extend((0..m).map(|i| a[oa + (start + i) * sa]));
                            &ba
                        }
                    };
                    let xb: &[B] = match sb {
                        0 => &bb[..m],
                        1 => &b[ob + start..ob + start + m],
                        _ => {
                            bb.clear();
                            bb.extend((0..m).map(|i| b[ob + (start + i) * sb]));
                            &bb
                        }
                    };
                    kernel(xa, xb, dc);
                }
            });
        })
    })
}
