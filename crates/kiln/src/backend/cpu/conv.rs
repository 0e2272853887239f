//! Direct convolutions on the CPU (f32, f64): one image at a time per thread, its unfolded
//! window matrix (`[c·kh·kw, oh·ow]`, small enough for the core's cache) multiplied by the
//! weight with the `gemm` crate straight into the NCHW output, instead of one matrix for the
//! whole batch (hundreds of MB written and read back). The gradients work the same way:
//! `fold(Wᵀ·g_b)` per image, and `Σ_b g_b·col_bᵀ` summed over per-thread accumulators.

use super::chunked::for_each_chunk_mut;
use super::simd::simd_fn;
use super::threads::{install, num_threads};
use super::window::{fold_plane, unfold_row, valid_range, Accumulate};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::WithDType;
use gemm::Parallelism;
use rayon::prelude::*;

/// `dst[m, n] (+)= a[m, k] · b[k, n]`, each operand given by (pointer, row stride, column
/// stride); `dst` is row-major with `n` columns. `threads` above 1 lets the product use that
/// many threads (see [`gemm_threads_per_task`]).
///
/// # Safety
/// Every element the strides reach for the given extents must be inside its slice.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into<T: WithDType>(
    threads: usize,
    dst: &mut [T],
    accumulate: bool,
    (m, n, k): (usize, usize, usize),
    a: *const T,
    (a_rs, a_cs): (usize, usize),
    b: *const T,
    (b_rs, b_cs): (usize, usize),
) {
    debug_assert!(dst.len() >= m * n);
    // SAFETY: forwarded to the caller; dst holds m·n elements, row stride n.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a,
            a_cs as isize,
            a_rs as isize,
            b,
            b_cs as isize,
            b_rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            inner_parallelism(threads, m * n * k),
        )
    }
}

fn inner_parallelism(threads: usize, flops: usize) -> Parallelism {
    match threads {
        t if t > 1 && flops >= 1 << 20 => Parallelism::Rayon(t),
        _ => Parallelism::None,
    }
}

/// The layout of image `b` of a 4-D NCHW layout, as a batch of one.
fn image(l: &Layout, b: usize) -> Layout {
    let d = l.dims();
    Layout::new(
        [1, d[1], d[2], d[3]].into(),
        l.strides().to_vec(),
        l.offset() + b * l.strides()[0],
        usize::MAX,
    )
    .expect("an image of a valid layout")
}

/// Image `b` of the input unfolded into `col` (`[c·kh·kw, oh·ow]`).
fn unfold_image<T: WithDType>(x: &[T], l: &Layout, win: &Window2d, b: usize, col: &mut [T]) {
    let one = Window2d { n: 1, ..*win };
    let lb = image(l, b);
    let p = col.len() / win.col_rows();
    for (row, dst) in col.chunks_mut(p).enumerate() {
        unfold_row(x, &lb, &one, row, dst);
    }
}

/// `(row stride, column stride)` of image `b` of an NCHW layout seen as `[c, h·w]`, if the
/// plane merges into one dim.
fn image_matrix(l: &Layout) -> Option<(usize, usize)> {
    let (d, s) = (l.dims(), l.strides());
    (s[2] == d[3] * s[3] || d[2] == 1).then_some((s[1], s[3]))
}

/// `y = conv(x, w)`, `[n, c_out, oh, ow]` contiguous; `w` is contiguous.
pub(super) fn forward<T: WithDType>(
    x: &[T],
    xl: &Layout,
    w: &[T],
    win: &Window2d,
    groups: usize,
    c_out: usize,
) -> Vec<T> {
    let [oh, ow] = win.out_hw();
    let (p, k) = (oh * ow, win.col_rows());
    let (kg, cg) = (k / groups, c_out / groups);
    let mut out = super::host_memory::filled_huge(T::ZERO, win.n * c_out * p);
    for_image_runs(&mut out, win.n, c_out * p, k * p, |col, b, y, threads| {
        unfold_image(x, xl, win, b, col);
        for g in 0..groups {
            // SAFETY: w is [c_out, kg] row-major, col [k, p]; both in bounds.
            unsafe {
                gemm_into(
                    threads,
                    &mut y[g * cg * p..(g + 1) * cg * p],
                    false,
                    (cg, p, kg),
                    w.as_ptr().add(g * cg * kg),
                    (kg, 1),
                    col.as_ptr().add(g * kg * p),
                    (p, 1),
                )
            }
        }
    });
    out
}

/// Threads each task's GEMMs may use when `n` images are shared out: all of them when there
/// are fewer images than threads (a batch of one would otherwise run on one core), else one.
/// Passed to each GEMM: a per-thread setting, as this was before, outlived its call, and after
/// a batch of one every later weight gradient nested a parallel GEMM inside each of its
/// parallel tasks (the CNN's epoch went from 17 to 26 s after the conv benchmarks had run).
fn gemm_threads_per_task(n: usize) -> usize {
    let threads = num_threads().max(1);
    if n < threads {
        threads
    } else {
        1
    }
}

/// Images per task: about four tasks per thread, so a thread slowed by other work (a busy
/// host, a noisy neighbour) hands the rest of its share to the others.
pub(super) fn images_per_task(n: usize) -> usize {
    n.div_ceil(4 * num_threads().max(1)).max(1)
}

/// Runs `f(scratch, image, out_image, gemm_threads)` for every image, in contiguous runs of
/// images ([`images_per_task`]), each allocating its `scratch` of `scratch_len` elements once;
/// `gemm_threads` is [`gemm_threads_per_task`].
fn for_image_runs<T: WithDType>(
    out: &mut [T],
    n: usize,
    per_image: usize,
    scratch_len: usize,
    f: impl Fn(&mut [T], usize, &mut [T], usize) + Sync + Send,
) {
    if per_image == 0 {
        return;
    }
    let run = images_per_task(n);
    let inner = gemm_threads_per_task(n);
    let task = |r: usize, images: &mut [T]| {
        let mut scratch = vec![T::ZERO; scratch_len];
        for (i, y) in images.chunks_mut(per_image).enumerate() {
            f(&mut scratch, r * run + i, y, inner);
        }
    };
    // Shared with the helper only with two threads and at least two runs, hence at least two
    // images and `inner == 1`; a batch smaller than the pool keeps the pool for its products.
    for_each_chunk_mut(out, run * per_image, task);
}

/// `dx` `[n, c_in, h, w]` from the output gradient `g` (`gl`, whose planes merge) and the
/// contiguous weight.
pub(super) fn backward_input<T: Accumulate>(
    g: &[T],
    gl: &Layout,
    w: &[T],
    win: &Window2d,
    groups: usize,
    c_out: usize,
) -> Option<Vec<T>> {
    let (g_rs, g_cs) = image_matrix(gl)?;
    let [oh, ow] = win.out_hw();
    let (p, k) = (oh * ow, win.col_rows());
    let (kg, cg) = (k / groups, c_out / groups);
    let plane = win.h * win.w;
    let one = Window2d { n: 1, ..*win };
    let col_layout = Layout::contiguous([k, p]);
    let mut out = vec![T::ZERO; win.n * win.c * plane];
    for_image_runs(
        &mut out,
        win.n,
        win.c * plane,
        k * p,
        |col, b, dx, threads| {
            let gb = gl.offset() + b * gl.strides()[0];
            for grp in 0..groups {
                // dcol[kg, p] = w_gᵀ [kg, cg] · g_b,g [cg, p].
                // SAFETY: w is [c_out, kg] row-major (read transposed); g's image plane
                // merges (checked), so [cg, p] with strides (g_rs, g_cs) is in bounds.
                unsafe {
                    gemm_into(
                        threads,
                        &mut col[grp * kg * p..(grp + 1) * kg * p],
                        false,
                        (kg, p, cg),
                        w.as_ptr().add(grp * cg * kg),
                        (1, kg),
                        g.as_ptr().add(gb + grp * cg * g_rs),
                        (g_rs, g_cs),
                    )
                }
            }
            if win.stride == [1, 1] && ow == win.w {
                fold_image_runs(col, &one, dx);
                return;
            }
            for (ch, d) in dx.chunks_mut(plane).enumerate() {
                fold_plane(col, &col_layout, &one, ch, d);
            }
        },
    );
    Some(out)
}

simd_fn! {
    /// `dst[k] += src[k]`, summed in the accumulation type.
    fn add_run<T: Accumulate>(dst: &mut [T], src: &[T]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            let mut a = d.to_acc();
            a += s.to_acc();
            *d = T::from_acc(a);
        }
    }
}

/// col2im of one image (`col` `[c·kh·kw, oh·ow]`, contiguous) into `dx` (`[c, h·w]`, zeros)
/// for unit strides and rows as wide as the output ("same" padding). A tap's valid rows
/// are then one shifted run of the plane: the entries of `col` that fall in the padding
/// (whose gradient is dropped) are zeroed first, so the run adds them harmlessly, in long
/// vectorised loops instead of one short loop per output row.
fn fold_image_runs<T: Accumulate>(col: &mut [T], win: &Window2d, dx: &mut [T]) {
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let plane = win.h * win.w;
    for (row, taps) in col.chunks_exact_mut(oh * ow).enumerate() {
        let (ch, i, j) = (row / (kh * kw), row / kw % kh, row % kw);
        let (y_lo, y_hi, y_start) = valid_range(win, 0, i, oh);
        let (x_lo, x_hi, x_start) = valid_range(win, 1, j, ow);
        if y_lo >= y_hi || x_lo >= x_hi {
            continue;
        }
        for r in taps[y_lo * ow..y_hi * ow].chunks_exact_mut(ow) {
            r[..x_lo].fill(T::ZERO);
            r[x_hi..].fill(T::ZERO);
        }
        // taps[t] belongs at dx[t + y_start·w + x_start]; the run skips the columns before
        // x_lo in the first row and after x_hi in the last, which may fall outside.
        let (t0, t1) = (y_lo * ow + x_lo, y_hi * ow - (ow - x_hi));
        let d0 = (t0 as isize + y_start * win.w as isize + x_start) as usize;
        let dst = &mut dx[ch * plane..(ch + 1) * plane];
        add_run(&mut dst[d0..d0 + (t1 - t0)], &taps[t0..t1]);
    }
}

/// `dw` `[c_out, c_in / groups, kh, kw]` from the input `x` and the output gradient `g`.
pub(super) fn backward_weight<T: WithDType>(
    x: &[T],
    xl: &Layout,
    g: &[T],
    gl: &Layout,
    win: &Window2d,
    groups: usize,
    c_out: usize,
) -> Option<Vec<T>> {
    let (g_rs, g_cs) = image_matrix(gl)?;
    let [oh, ow] = win.out_hw();
    let (p, k) = (oh * ow, win.col_rows());
    let (kg, cg) = (k / groups, c_out / groups);
    let run = images_per_task(win.n);
    let runs: Vec<usize> = (0..win.n).step_by(run).collect();
    let inner = gemm_threads_per_task(win.n);
    let partials = install(|| {
        runs.par_iter()
            .map(|&start| {
                let (mut dw, mut col) = (vec![T::ZERO; c_out * kg], vec![T::ZERO; k * p]);
                for b in start..(start + run).min(win.n) {
                    unfold_image(x, xl, win, b, &mut col);
                    let gb = gl.offset() + b * gl.strides()[0];
                    for grp in 0..groups {
                        // dw_g[cg, kg] += g_b,g [cg, p] · col_gᵀ [p, kg].
                        // SAFETY: as in `backward_input`; col is [k, p] row-major.
                        unsafe {
                            gemm_into(
                                inner,
                                &mut dw[grp * cg * kg..(grp + 1) * cg * kg],
                                true,
                                (cg, kg, p),
                                g.as_ptr().add(gb + grp * cg * g_rs),
                                (g_rs, g_cs),
                                col.as_ptr().add(grp * kg * p),
                                (1, p),
                            )
                        }
                    }
                }
                dw
            })
            .collect::<Vec<_>>()
    });
    let mut total = vec![T::ZERO; c_out * kg];
    for part in partials {
        for (t, v) in total.iter_mut().zip(part) {
            *t = T::from_f64(t.to_f64() + v.to_f64());
        }
    }
    Some(total)
}
