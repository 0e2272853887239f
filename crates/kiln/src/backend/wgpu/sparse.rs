//! CSR products on wgpu devices, in WGSL: one invocation per output element (row, column of
//! the dense operand), accumulating in f32. Rows longer than [`LONG_ROW`] are computed as
//! their pieces first (one invocation per piece and column, into a scratch buffer), then
//! summed in piece order by the row's invocation: a skewed row does not serialise the
//! product, and the sums are the same on every run (no atomics).
//!
//! The transposed product has no direct kernel (it would need atomics or a private copy of
//! the output per workgroup): [`SparseStorage::csr_matmul`] answers `None` and the caller
//! multiplies by the cached transpose, as on the CPU.

use super::codegen::{self, binding, class, prelude, Access, Params, ENTRY};
use super::WgpuStorage;
use crate::backend::sparse::{CsrProduct, CsrRef, SparseStorage, LONG_ROW};
use crate::layout::Layout;
use crate::{DType, Error, Result};

/// WGSL `NAME(j) -> u32`: entry `j` of the index binding `array` (`row_ptr`, `col_idx`)
/// as `u32` (an `I64` index holds values below 2^32 on wgpu, where a tensor has fewer than
/// 2^32 elements).
fn index_fn(name: &str, array: &str, index: DType) -> Result<String> {
    let word = match index {
        DType::U32 => "",
        DType::I64 => ".x",
        other => {
            return Err(Error::Msg(format!(
                "Csr: indices of dtype {other} (expected u32 or i64)"
            )))
        }
    };
    Ok(format!(
        "fn {name}(j: u32) -> u32 {{ return load_{array}(j){word}; }}\n"
    ))
}

/// Pushes a 2-D operand's offset, row stride and column stride after a rank-0 `Params`
/// head (words 0-5), where the kernels read them by position.
fn push_2d(p: &mut Params, l: &Layout) -> Result<()> {
    let s = l.strides();
    for v in [l.offset(), s[0], s[1]] {
        p.push(codegen::word(v)?);
    }
    Ok(())
}

/// `A`'s dtype, if the device computes in it, and the dense operands' check.
fn value_dtype(
    a: &CsrRef<'_, WgpuStorage>,
    dense: &[&WgpuStorage],
    op: &'static str,
) -> Result<DType> {
    let dtype = a.values.dtype;
    class(a.values.device_arc(), dtype, op)?;
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType { op, dtype });
    }
    for d in dense {
        if d.dtype != dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: dtype,
                rhs: d.dtype,
            });
        }
    }
    Ok(dtype)
}

/// The dot product of row-entries `start..end` of `A` with column `j` of `x`.
const ROW_DOT: &str = "fn row_dot(start: u32, end: u32, j: u32) -> f32 {\n  \
    var acc = 0.0;\n  let xo = p[6] + j * p[8];\n  \
    for (var k = start; k < end; k++) { acc += load_values(k) * load_x(xo + ci(k) * p[7]); }\n  \
    return acc;\n}\n";

impl SparseStorage for WgpuStorage {
    fn csr_matmul(
        a: CsrRef<'_, Self>,
        x: &Self,
        xl: &Layout,
        product: CsrProduct,
        acc: Option<(f64, &Self, &Layout)>,
    ) -> Result<Option<Self>> {
        const OP: &str = "Csr::matmul";
        if product.transpose {
            return Ok(None);
        }
        let mut dense = vec![x];
        dense.extend(acc.map(|(_, y, _)| y));
        let dtype = value_dtype(&a, &dense, OP)?;
        let index = a.row_ptr.dtype;
        let dev = a.values.device_arc();
        let n = xl.dims()[1];
        let count = a.rows * n;
        let out = WgpuStorage::alloc(dev, dtype, count)?;
        if count == 0 {
            return Ok(Some(out));
        }
        // Params: scalars n, alpha, beta, whether Y is read; then X's and Y's (offset, row
        // stride, column stride) and the number of pieces.
        let mut p = Params::new(count, &[])?;
        let beta = acc.map_or(0.0, |(b, _, _)| b);
        p.scalar_u32(0, codegen::word(n)?)
            .scalar_f32(1, product.alpha as f32)
            .scalar_f32(2, beta as f32)
            .scalar_u32(3, u32::from(beta != 0.0));
        push_2d(&mut p, xl)?;
        match acc {
            Some((_, _, yl)) => push_2d(&mut p, yl)?,
            None => {
                p.push(0).push(0).push(0);
            }
        }
        p.push(codegen::word(a.n_pieces)?)
            .push(codegen::word(LONG_ROW)?);

        // Partial sums of the long rows' pieces, [n_pieces, n] in f32.
        let partial = WgpuStorage::alloc(dev, DType::F32, (a.n_pieces * n).max(1))?;
        // The bindings both kernels read; a binding a shader never uses is dropped from
        // its layout, so the pieces kernel binds `row_ptr` only in the row kernel.
        let ci = index_fn("ci", "col_idx", index)?;
        let rp = index_fn("rp", "row_ptr", index)?;
        let header = |first: u32, extra: &str| {
            let mut s = prelude(&[dtype]);
            s += &binding("col_idx", first, index, Access::Read);
            s += &binding("values", first + 1, dtype, Access::Read);
            s += &binding("x", first + 2, dtype, Access::Read);
            s += &binding("pieces", first + 3, DType::I64, Access::Read);
            s += extra;
            s += &ci;
            s += ROW_DOT;
            s
        };
        if a.n_pieces > 0 {
            let key = format!("csr_pieces:{dtype:?}:{index:?}");
            let pipeline = dev.pipeline(&key, || {
                header(1, &binding("partial", 5, DType::F32, Access::ReadWrite))
                    + &format!(
                        "{ENTRY} {{\n  let i = linear_id(wid, nwg, lid);\n  \
                         if (i >= p[12] * p[2]) {{ return; }}\n  \
                         let piece = i / p[2];\n  \
                         store_partial(i, row_dot(load_pieces(3u * piece + 1u).x, \
                         load_pieces(3u * piece + 2u).x, i % p[2]));\n}}\n"
                    )
            })?;
            dev.dispatch(
                pipeline,
                p.bytes(),
                vec![
                    a.col_idx.buf.clone(),
                    a.values.buf.clone(),
                    x.buf.clone(),
                    a.pieces.buf.clone(),
                    partial.buf.clone(),
                ],
                dev.grid(((a.n_pieces * n) as u64).div_ceil(256))?,
            )?;
        }
        let key = format!("csr_rows:{dtype:?}:{index:?}");
        let pipeline = dev.pipeline(&key, || {
            let mut extra = binding("partial", 6, DType::F32, Access::Read);
            extra += &binding("y", 7, dtype, Access::Read);
            extra += &binding("out", 8, dtype, Access::ReadWrite);
            extra += &binding("row_ptr", 1, index, Access::Read);
            extra += &rp;
            header(2, &extra)
                + &format!(
                    "{ENTRY} {{\n  let i = linear_id(wid, nwg, lid);\n  \
                     if (i >= p[0]) {{ return; }}\n  \
                     let row = i / p[2];\n  let j = i % p[2];\n  \
                     let start = rp(row);\n  let end = rp(row + 1u);\n  \
                     var acc = 0.0;\n  \
                     if (end - start > p[13]) {{\n    \
                       // The row's first piece (pieces are in row order), then its run.\n    \
                       var lo = 0u; var hi = p[12];\n    \
                       while (lo < hi) {{ let mid = (lo + hi) / 2u; \
                       if (load_pieces(3u * mid).x < row) {{ lo = mid + 1u; }} else {{ hi = mid; }} }}\n    \
                       for (var q = lo; q < p[12] && load_pieces(3u * q).x == row; q++) {{ \
                       acc += load_partial(q * p[2] + j); }}\n  \
                     }} else {{\n    acc = row_dot(start, end, j);\n  }}\n  \
                     var v = pf(1) * acc;\n  \
                     if (p[5] != 0u) {{ v += pf(2) * load_y(p[9] + row * p[10] + j * p[11]); }}\n  \
                     store_out(i, v);\n}}\n"
                )
        })?;
        // Without Y, X stands in for it (read-only, never read).
        let y = acc.map_or(x, |(_, y, _)| y);
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![
                a.row_ptr.buf.clone(),
                a.col_idx.buf.clone(),
                a.values.buf.clone(),
                x.buf.clone(),
                a.pieces.buf.clone(),
                partial.buf.clone(),
                y.buf.clone(),
                out.buf.clone(),
            ],
            dev.grid((count as u64).div_ceil(256))?,
        )?;
        Ok(Some(out))
    }

    fn csr_sampled_dot(
        a: CsrRef<'_, Self>,
        lhs: &Self,
        ll: &Layout,
        rhs: &Self,
        rl: &Layout,
    ) -> Result<Self> {
        const OP: &str = "Csr::matmul backward";
        let dtype = value_dtype(&a, &[lhs, rhs], OP)?;
        let index = a.row_ptr.dtype;
        let fns = index_fn("rp", "row_ptr", index)? + &index_fn("ci", "col_idx", index)?;
        let dev = a.values.device_arc();
        let out = WgpuStorage::alloc(dev, dtype, a.nnz)?;
        if a.nnz == 0 {
            return Ok(out);
        }
        let n = ll.dims()[1];
        let mut p = Params::new(a.nnz, &[])?;
        p.scalar_u32(0, codegen::word(n)?)
            .scalar_u32(1, codegen::word(a.rows)?);
        push_2d(&mut p, ll)?;
        push_2d(&mut p, rl)?;
        let key = format!("csr_sampled_dot:{dtype:?}:{index:?}");
        let pipeline = dev.pipeline(&key, || {
            let mut s = prelude(&[dtype]);
            s += &binding("row_ptr", 1, index, Access::Read);
            s += &binding("col_idx", 2, index, Access::Read);
            s += &binding("lhs", 3, dtype, Access::Read);
            s += &binding("rhs", 4, dtype, Access::Read);
            s += &binding("out", 5, dtype, Access::ReadWrite);
            s += &fns;
            s += &format!(
                "{ENTRY} {{\n  let k = linear_id(wid, nwg, lid);\n  if (k >= p[0]) {{ return; }}\n  \
                 // The row holding entry k: the last row whose start is at most k.\n  \
                 var lo = 0u; var hi = p[3];\n  \
                 while (lo < hi) {{ let mid = (lo + hi) / 2u; \
                 if (rp(mid + 1u) <= k) {{ lo = mid + 1u; }} else {{ hi = mid; }} }}\n  \
                 let lo_at = p[6] + lo * p[7];\n  let ro_at = p[9] + ci(k) * p[10];\n  \
                 var acc = 0.0;\n  \
                 for (var j = 0u; j < p[2]; j++) {{ \
                 acc += load_lhs(lo_at + j * p[8]) * load_rhs(ro_at + j * p[11]); }}\n  \
                 store_out(k, acc);\n}}\n"
            );
            s
        })?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![
                a.row_ptr.buf.clone(),
                a.col_idx.buf.clone(),
                lhs.buf.clone(),
                rhs.buf.clone(),
                out.buf.clone(),
            ],
            dev.grid((a.nnz as u64).div_ceil(256))?,
        )?;
        Ok(out)
    }
}
