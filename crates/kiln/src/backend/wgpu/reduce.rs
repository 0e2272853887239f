//! Reductions over any set of dims of any layout, and softmax along one dim.
//!
//! A reduction sees its input as `[outer, inner]`: the kept dims (row-major, the output's
//! order) and the reduced dims, each collapsed and addressed by strides. Long rows are
//! reduced by a workgroup each (split into chunks with a second pass when there are few
//! rows, so a full reduction still fills the GPU); short rows by one invocation each.

use super::codegen::{self, binding, class, collapse, prelude, Access, Class, Params, ENTRY};
use super::WgpuStorage;
use crate::layout::Layout;
use crate::op::ReduceOp;
use crate::{DType, Error, Result};

/// Elements one workgroup reduces per chunk when a row of `inner` elements is split: enough
/// chunks to give the GPU about 512 workgroups, each of 1024 to 16384 elements (4 to 64 per
/// invocation). `KILN_WGPU_REDUCE_CHUNK` fixes it, for measurements. On the H100, with four
/// loads in flight, chunks of 16384 read a 64M-element sum at 2558 GB/s, 4096 at 2310 and
/// 2048 at 1930 (`bench/tools/wgpu_probe.sh reduce`, fresh processes; CUDA's copy: 2832);
/// a 64K-element sum in chunks of 16384 (4 workgroups) took 0.042 ms against 0.035 in
/// chunks of 4096.
fn chunk_elems(inner: usize) -> usize {
    static FIXED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let fixed = *FIXED.get_or_init(|| {
        std::env::var("KILN_WGPU_REDUCE_CHUNK")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&c| c >= 256)
    });
    fixed.unwrap_or_else(|| {
        inner
            .div_ceil(512)
            .next_multiple_of(1024)
            .clamp(1024, 16384)
    })
}

/// Loads in flight per invocation in a value reduction over a contiguous or evenly strided
/// row (1, 2 or 4; `KILN_WGPU_REDUCE_UNROLL` overrides the default, for measurements). With
/// one, the 64M-element sum read 1847 GB/s on the H100; with four, 2558.
fn unroll() -> u32 {
    static UNROLL: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UNROLL.get_or_init(|| {
        std::env::var("KILN_WGPU_REDUCE_UNROLL")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|u| [1, 2, 4].contains(u))
            .unwrap_or(4)
    })
}
/// Rows shorter than this are reduced by one invocation each.
const SHORT_ROW: usize = 32;

fn identity(op: ReduceOp, c: Class) -> &'static str {
    match (op, c) {
        (ReduceOp::Sum, c) => c.zero(),
        (ReduceOp::Max | ReduceOp::ArgMax, Class::Float) => "bitcast<f32>(0xff800000u)",
        (ReduceOp::Min | ReduceOp::ArgMin, Class::Float) => "bitcast<f32>(0x7f800000u)",
        (ReduceOp::Max | ReduceOp::ArgMax, Class::Uint) => "0u",
        (ReduceOp::Min | ReduceOp::ArgMin, Class::Uint) => "0xffffffffu",
        (ReduceOp::Max | ReduceOp::ArgMax, Class::Int64) => "vec2<u32>(0u, 0x80000000u)",
        (ReduceOp::Min | ReduceOp::ArgMin, Class::Int64) => "vec2<u32>(0xffffffffu, 0x7fffffffu)",
    }
}

/// WGSL functions `combine(a, b)` (value reductions) or `better(av, ai, bv, bi)` (whether
/// `(bv, bi)` replaces `(av, ai)` for arg reductions: the first extremum, NaN first).
fn combine_fns(op: ReduceOp, c: Class) -> String {
    let ty = c.wgsl();
    let value = match (op, c) {
        (ReduceOp::Sum, Class::Int64) => "i64_add(a, b)",
        (ReduceOp::Sum, _) => "a + b",
        (ReduceOp::Max, Class::Float) => "fmaximum(a, b)",
        (ReduceOp::Min, Class::Float) => "fminimum(a, b)",
        (ReduceOp::Max, Class::Uint) => "max(a, b)",
        (ReduceOp::Min, Class::Uint) => "min(a, b)",
        (ReduceOp::Max, Class::Int64) => "i64_max(a, b)",
        (ReduceOp::Min, Class::Int64) => "i64_min(a, b)",
        _ => "a",
    };
    let max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
    let beats = match (max, c) {
        (true, Class::Int64) => "i64_lt(av, bv)",
        (false, Class::Int64) => "i64_lt(bv, av)",
        (true, _) => "bv > av",
        (false, _) => "bv < av",
    };
    let equal = if c == Class::Int64 {
        "i64_eq(av, bv)"
    } else {
        "av == bv"
    };
    let nan = if c == Class::Float {
        "if (is_nan(av)) { return is_nan(bv) && bi < ai; }\n  if (is_nan(bv)) { return true; }\n  "
    } else {
        ""
    };
    format!(
        "fn combine(a: {ty}, b: {ty}) -> {ty} {{ return {value}; }}\n\
         fn better(av: {ty}, ai: u32, bv: {ty}, bi: u32) -> bool {{\n  {nan}\
         if ({beats}) {{ return true; }}\n  return {equal} && bi < ai;\n}}\n"
    )
}

/// WGSL `roff(r, flat, stride)`: the offset of element `r` of a row in the reduced dims
/// (parameters after the kept dims' sizes and strides: the reduced sizes, then strides).
const RED_OFFSET: &str = "fn red_offset(r: u32) -> u32 {\n  let kr = p[1];\n  let rr = p[3];\n  \
    let at = HEAD + kr + kr + 1u;\n  var rem = r;\n  var off = 0u;\n  \
    for (var d = rr; d > 1u; d--) {\n    let s = p[at + d - 1u];\n    \
    off += (rem % s) * p[at + rr + d - 1u];\n    rem = rem / s;\n  }\n  \
    return off + rem * p[at + rr];\n}\n\
    fn roff(r: u32, flat: bool, stride: u32) -> u32 {\n  if (flat) { return r * stride; }\n  return red_offset(r);\n}\n";

/// A kernel where each workgroup reduces one row or chunk `g`: `range` defines `o` (the
/// row), `start` and `stop`; `walk` folds this invocation's elements into `acc` (and `bi`,
/// the index, for arg reductions); a tree in workgroup memory merges the invocations; the
/// first stores the result with `store` (which sees `o` = `g`).
fn workgroup_reduce(
    ty: &str,
    init: &str,
    arg: bool,
    range: &str,
    walk: &str,
    store: &str,
) -> String {
    let merge = if arg {
        "if (better(sv[lid], si[lid], sv[lid + s], si[lid + s])) { sv[lid] = sv[lid + s]; si[lid] = si[lid + s]; }"
    } else {
        "sv[lid] = combine(sv[lid], sv[lid + s]);"
    };
    format!(
        "var<workgroup> sv: array<{ty}, 256>;\nvar<workgroup> si: array<u32, 256>;\n\
         {ENTRY} {{\n  let g = group_id(wid, nwg);\n  if (g >= p[0]) {{ return; }}\n  \
         {range}\n  \
         let base = strided(o, p[1], HEAD, HEAD + p[1]);\n  \
         let flat = p[3] == 1u;\n  let rstride = p[HEAD + 2u * p[1] + 2u];\n  \
         var acc: {ty} = {init};\n  var bi = 0xffffffffu;\n  \
         {walk}\n  \
         sv[lid] = acc;\n  si[lid] = bi;\n  workgroupBarrier();\n  \
         for (var s = 128u; s > 0u; s >>= 1u) {{\n    if (lid < s) {{ {merge} }}\n    workgroupBarrier();\n  }}\n  \
         if (lid == 0u) {{\n    let acc = sv[0];\n    let bi = si[0];\n    let o = g;\n    {store}\n  }}\n}}\n"
    )
}

impl WgpuStorage {
    pub(super) fn reduce_impl(
        &self,
        l: &Layout,
        dims: &[usize],
        op: ReduceOp,
    ) -> Result<WgpuStorage> {
        let dev = self.device_arc();
        let c = class(dev, self.dtype, op.name())?;
        let shape = l.dims();
        let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
        for (d, (&size, &stride)) in shape.iter().zip(l.strides()).enumerate() {
            if dims.contains(&d) {
                rd.push(size);
                rs.push(stride);
            } else {
                kd.push(size);
                ks.push(stride);
            }
        }
        let outer: usize = kd.iter().product();
        let inner: usize = rd.iter().product();
        let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
        if arg && inner == 0 {
            return Err(Error::Msg(format!(
                "{}: the reduced dims are empty",
                op.name()
            )));
        }
        let out_dtype = if arg { DType::I64 } else { self.dtype };
        let (kd, ks) = collapse(&kd, &[&ks]);
        let (rd, rs) = collapse(&rd, &[&rs]);
        let short = inner < SHORT_ROW;
        let chunks = if short || outer >= 1024 {
            1
        } else {
            inner.div_ceil(chunk_elems(inner)).max(1)
        };
        let partial_dtype = match c {
            Class::Float => DType::F32,
            Class::Uint => DType::U32,
            Class::Int64 => DType::I64,
        };
        // Arg reductions split into chunks keep each chunk's winning index (u32: a row's
        // length fits a shader word), and a second pass picks among them by value.
        let first_out = match (chunks > 1, arg) {
            (false, _) => out_dtype,
            (true, false) => partial_dtype,
            (true, true) => DType::U32,
        };
        let out = WgpuStorage::alloc(dev, first_out, outer * chunks)?;
        let x_view = (
            l.offset(),
            kd.as_slice(),
            ks[0].as_slice(),
            rd.as_slice(),
            rs[0].as_slice(),
        );
        self.reduce_pass(op, c, x_view, (outer, inner, chunks, short), &out)?;
        if chunks == 1 {
            return Ok(out);
        }
        if arg {
            let final_out = WgpuStorage::alloc(dev, out_dtype, outer)?;
            self.arg_merge_pass(op, c, x_view, (outer, chunks), &out, &final_out)?;
            return Ok(final_out);
        }
        // Second pass over the partials `[outer, chunks]`.
        let final_out = WgpuStorage::alloc(dev, out_dtype, outer)?;
        out.reduce_pass(
            op,
            c,
            (0, &[outer], &[chunks], &[chunks], &[1]),
            (outer, chunks, 1, false),
            &final_out,
        )?;
        Ok(final_out)
    }

    /// One reduction dispatch of `self` (kept dims/strides, reduced dims/strides) into `out`.
    #[allow(clippy::type_complexity)]
    fn reduce_pass(
        &self,
        op: ReduceOp,
        c: Class,
        (offset, kd, ks, rd, rs): (usize, &[usize], &[usize], &[usize], &[usize]),
        (outer, inner, chunks, short): (usize, usize, usize, bool),
        out: &WgpuStorage,
    ) -> Result<()> {
        let dev = self.device_arc();
        let mut p = Params::new(outer * chunks, kd)?;
        p.operand(offset, ks)?;
        for &d in rd {
            p.push(codegen::word(d)?);
        }
        for &s in rs {
            p.push(codegen::word(s)?);
        }
        let chunk = inner.div_ceil(chunks);
        p.scalar_u32(0, codegen::word(inner)?)
            .scalar_u32(1, rd.len() as u32)
            .scalar_u32(2, codegen::word(chunk)?)
            .scalar_u32(3, chunks as u32);
        let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
        let key = format!(
            "reduce:{op:?}:{:?}:{:?}:{short}:{}",
            self.dtype,
            out.dtype,
            unroll()
        );
        let pipeline = dev.pipeline(&key, || {
            let ty = c.wgsl();
            let mut src = prelude(&[self.dtype, out.dtype]);
            src += &binding("x", 1, self.dtype, Access::Read);
            src += &binding("out", 2, out.dtype, Access::ReadWrite);
            src += &combine_fns(op, c);
            src += RED_OFFSET;
            let store = match (arg, out.dtype) {
                (true, DType::U32) => "store_out(o, bi);",
                (true, _) => "store_out(o, vec2<u32>(bi, 0u));",
                (false, _) => "store_out(o, acc);",
            };
            let step = if arg {
                "let v = load_x(base + roff(r, flat, rstride));\n      if (better(acc, bi, v, r)) { acc = v; bi = r; }"
            } else {
                "acc = combine(acc, load_x(base + roff(r, flat, rstride)));"
            };
            let init = identity(op, c);
            if short {
                src += &format!(
                    "{ENTRY} {{\n  let o = linear_id(wid, nwg, lid);\n  if (o >= p[0]) {{ return; }}\n  \
                     let base = strided(o, p[1], HEAD, HEAD + p[1]);\n  \
                     let flat = p[3] == 1u;\n  let rstride = p[HEAD + 2u * p[1] + 2u];\n  var acc: {ty} = {init};\n  var bi = 0xffffffffu;\n  \
                     for (var r = 0u; r < p[2]; r++) {{\n      {step}\n  }}\n  {store}\n}}\n"
                );
            } else {
                // The row's layout is uniform over the workgroup: `flat` rows (one reduced
                // dim) are walked by a stride, without `red_offset` per element; value
                // reductions keep `unroll` partial results, so as many loads are in flight.
                let u = unroll();
                let walk = if arg {
                    format!(
                        "if (flat) {{\n    for (var r = start + lid; r < stop; r += 256u) {{\n      \
                         let v = load_x(base + r * rstride);\n      \
                         if (better(acc, bi, v, r)) {{ acc = v; bi = r; }}\n    }}\n  }} else {{\n    \
                         for (var r = start + lid; r < stop; r += 256u) {{\n      {step}\n    }}\n  }}"
                    )
                } else {
                    let parts: String = (1..u).map(|k| format!("var a{k}: {ty} = {init};\n    ")).collect();
                    let loads: String = (1..u)
                        .map(|k| format!("\n      a{k} = combine(a{k}, load_x(j + {k}u * hop));"))
                        .collect();
                    let merge: String = (1..u).map(|k| format!("\n    acc = combine(acc, a{k});")).collect();
                    format!(
                        "if (flat) {{\n    {parts}let hop = 256u * rstride;\n    var r = start + lid;\n    \
                         for (; r + {last}u < stop; r += {span}u) {{\n      let j = base + r * rstride;\n      \
                         acc = combine(acc, load_x(j));{loads}\n    }}\n    \
                         for (; r < stop; r += 256u) {{ acc = combine(acc, load_x(base + r * rstride)); }}{merge}\n  }} else {{\n    \
                         for (var r = start + lid; r < stop; r += 256u) {{ {step} }}\n  }}",
                        last = 256 * (u - 1),
                        span = 256 * u,
                    )
                };
                src += &workgroup_reduce(
                    ty,
                    init,
                    arg,
                    "let chunks = p[5];\n  let o = g / chunks;\n  let ch = g % chunks;\n  \
                     let start = ch * p[4];\n  let stop = min(start + p[4], p[2]);",
                    &walk,
                    store,
                );
            }
            src
        })?;
        let groups = if short {
            (outer as u64).div_ceil(256)
        } else {
            (outer * chunks) as u64
        };
        let grid = dev.grid(groups)?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![self.buf.clone(), out.buf.clone()],
            grid,
        )
    }

    /// The second pass of a split arg reduction: for each row, the best of its chunks'
    /// winning indices `idx` (`[outer, chunks]`, u32), compared by the values they index in
    /// `self` (the reduction's input, addressed as in the first pass), into `out` (i64).
    #[allow(clippy::type_complexity)]
    fn arg_merge_pass(
        &self,
        op: ReduceOp,
        c: Class,
        (offset, kd, ks, rd, rs): (usize, &[usize], &[usize], &[usize], &[usize]),
        (outer, chunks): (usize, usize),
        idx: &WgpuStorage,
        out: &WgpuStorage,
    ) -> Result<()> {
        let dev = self.device_arc();
        let mut p = Params::new(outer, kd)?;
        p.operand(offset, ks)?;
        for &d in rd {
            p.push(codegen::word(d)?);
        }
        for &s in rs {
            p.push(codegen::word(s)?);
        }
        p.scalar_u32(0, codegen::word(chunks)?)
            .scalar_u32(1, rd.len() as u32);
        let key = format!("reduce_arg_merge:{op:?}:{:?}", self.dtype);
        let pipeline = dev.pipeline(&key, || {
            let mut src = prelude(&[self.dtype, DType::U32, DType::I64]);
            src += &binding("x", 1, self.dtype, Access::Read);
            src += &binding("idx", 2, DType::U32, Access::Read);
            src += &binding("out", 3, DType::I64, Access::ReadWrite);
            src += &combine_fns(op, c);
            src += RED_OFFSET;
            src += &workgroup_reduce(
                c.wgsl(),
                identity(op, c),
                true,
                "let o = g;\n  let start = 0u;\n  let stop = p[2];",
                "for (var k = lid; k < stop; k += 256u) {\n    let r = load_idx(o * stop + k);\n    if (r == 0xffffffffu) { continue; }\n    \
                 let v = load_x(base + roff(r, flat, rstride));\n    \
                 if (better(acc, bi, v, r)) { acc = v; bi = r; }\n  }",
                "store_out(o, vec2<u32>(bi, 0u));",
            );
            src
        })?;
        let grid = dev.grid(outer as u64)?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![self.buf.clone(), idx.buf.clone(), out.buf.clone()],
            grid,
        )
    }

    pub(super) fn softmax_impl(&self, l: &Layout, dim: usize, log: bool) -> Result<WgpuStorage> {
        let dev = self.device_arc();
        let op = if log { "log_softmax" } else { "softmax" };
        if class(dev, self.dtype, op)? != Class::Float {
            return Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype,
            });
        }
        let dims = l.dims();
        let out_strides = codegen::contiguous_strides(dims);
        let (mut od, mut is, mut os) = (vec![], vec![], vec![]);
        for d in 0..dims.len() {
            if d != dim {
                od.push(dims[d]);
                is.push(l.strides()[d]);
                os.push(out_strides[d]);
            }
        }
        let rows: usize = od.iter().product();
        let (od, st) = collapse(&od, &[&is, &os]);
        let mut p = Params::new(rows, &od)?;
        p.operand(l.offset(), &st[0])?.operand(0, &st[1])?;
        p.scalar_u32(0, codegen::word(dims[dim])?)
            .scalar_u32(1, codegen::word(l.strides()[dim])?)
            .scalar_u32(2, codegen::word(out_strides[dim])?);
        let out = WgpuStorage::alloc(dev, self.dtype, l.elem_count())?;
        let key = format!("softmax:{:?}:{log}", self.dtype);
        let pipeline = dev.pipeline(&key, || {
            let mut src = prelude(&[self.dtype]);
            src += &binding("x", 1, self.dtype, Access::Read);
            src += &binding("out", 2, self.dtype, Access::ReadWrite);
            let write = if log {
                "v - m - log(total)"
            } else {
                "exp(v - m) / total"
            };
            src += &format!(
                "var<workgroup> sv: array<f32, 256>;\n\
                 fn tree_max(v: f32, lid: u32) -> f32 {{\n  sv[lid] = v;\n  workgroupBarrier();\n  \
                 for (var s = 128u; s > 0u; s >>= 1u) {{ if (lid < s) {{ sv[lid] = fmaximum(sv[lid], sv[lid + s]); }} workgroupBarrier(); }}\n  \
                 let r = sv[0];\n  workgroupBarrier();\n  return r;\n}}\n\
                 fn tree_sum(v: f32, lid: u32) -> f32 {{\n  sv[lid] = v;\n  workgroupBarrier();\n  \
                 for (var s = 128u; s > 0u; s >>= 1u) {{ if (lid < s) {{ sv[lid] = sv[lid] + sv[lid + s]; }} workgroupBarrier(); }}\n  \
                 let r = sv[0];\n  workgroupBarrier();\n  return r;\n}}\n\
                 {ENTRY} {{\n  let row = group_id(wid, nwg);\n  if (row >= p[0]) {{ return; }}\n  \
                 let n = p[2];\n  let xs = p[3];\n  let os = p[4];\n  \
                 let xb = strided(row, p[1], HEAD, operand_at(0u));\n  let ob = strided(row, p[1], HEAD, operand_at(1u));\n  \
                 var m = bitcast<f32>(0xff800000u);\n  \
                 for (var j = lid; j < n; j += 256u) {{ m = fmaximum(m, load_x(xb + j * xs)); }}\n  \
                 m = tree_max(m, lid);\n  var acc = 0.0;\n  \
                 for (var j = lid; j < n; j += 256u) {{ acc += exp(load_x(xb + j * xs) - m); }}\n  \
                 let total = tree_sum(acc, lid);\n  \
                 for (var j = lid; j < n; j += 256u) {{ let v = load_x(xb + j * xs); store_out(ob + j * os, {write}); }}\n}}\n"
            );
            src
        })?;
        let grid = dev.grid(rows as u64)?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![self.buf.clone(), out.buf.clone()],
            grid,
        )?;
        Ok(out)
    }
}
