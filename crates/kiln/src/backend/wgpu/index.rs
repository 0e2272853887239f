//! Index ops: `index_select`, `gather` and `scatter_add` along one dim of any layout. An id
//! outside the indexed dim reads as zero (`index_select`, `gather`) or is skipped
//! (`scatter_add`); the tensor layer has already refused such ids where it can see them.

use super::codegen::{self, binding, class, prelude, Access, Class, Params, ENTRY};
use super::elementwise::{binary_expr, Target};
use super::WgpuStorage;
use crate::layout::Layout;
use crate::op::BinaryOp;
use crate::{DType, Error, Result};

/// WGSL `id_ok(j, size) -> bool` and `id_at(j) -> u32` for an id tensor of `dtype`.
fn id_fns(dtype: DType) -> Result<String> {
    Ok(match dtype {
        DType::I64 => "fn id_at(j: u32) -> u32 { return load_ids(j).x; }\n\
                       fn id_ok(j: u32, size: u32) -> bool { let v = load_ids(j); return v.y == 0u && v.x < size; }\n"
            .into(),
        DType::U32 | DType::U8 => "fn id_at(j: u32) -> u32 { return load_ids(j); }\n\
                                   fn id_ok(j: u32, size: u32) -> bool { return load_ids(j) < size; }\n"
            .into(),
        other => {
            return Err(Error::Msg(format!(
                "index: ids must be an integer tensor, got {other}"
            )))
        }
    })
}

/// A chunk of a tensor read or written by one dispatch: its first element, its length and
/// the byte range bound (`None`: the whole buffer).
type Chunk = (usize, usize, Option<(u64, u64)>);

/// `strides` with the one of `dim` set to 0.
fn without(strides: &[usize], dim: usize) -> Vec<usize> {
    let mut s = strides.to_vec();
    s[dim] = 0;
    s
}

impl WgpuStorage {
    /// A kernel reading this storage (`x`) at positions taken from ids (`ids`, integer) into
    /// `out` (this dtype), with the ids' accessors `id_at` / `id_ok`; `entry` is its
    /// entry point.
    fn gather_pipeline(
        &self,
        key: &str,
        ids: DType,
        entry: impl FnOnce() -> String,
    ) -> Result<std::sync::Arc<super::context::Pipeline>> {
        id_fns(ids)?;
        self.device_arc().pipeline(key, || {
            let mut s = prelude(&[self.dtype]);
            s += &binding("x", 1, self.dtype, Access::Read);
            s += &binding("ids", 2, ids, Access::Read);
            s += &binding("out", 3, self.dtype, Access::ReadWrite);
            s += &id_fns(ids).expect("checked above");
            s += &entry();
            s
        })
    }

    /// Tensors larger than one storage binding (a training set on lavapipe, whose bindings
    /// stop at 128 MiB) are read and written in chunks: one dispatch per (output chunk,
    /// source chunk), each writing the rows whose source lies in its chunk.
    pub(super) fn index_select_impl(
        &self,
        l: &Layout,
        ids: &WgpuStorage,
        il: &Layout,
        dim: usize,
    ) -> Result<WgpuStorage> {
        let dev = self.device_arc();
        let zero = class(dev, self.dtype, "index_select")?.zero();
        id_fns(ids.dtype)?;
        let mut dims = l.dims().to_vec();
        let n_ids = il.elem_count();
        dims[dim] = n_ids;
        let count: usize = dims.iter().product();
        let inner: usize = dims[dim + 1..].iter().product();
        let out = WgpuStorage::alloc(dev, self.dtype, count)?;
        let key = format!("index_select:{:?}:{:?}", self.dtype, ids.dtype);
        // Extra words: ids offset and stride, output start, source start and length,
        // whether this is the first source chunk (which writes the zeros of bad ids).
        let pipeline = self.gather_pipeline(&key, ids.dtype, || {
            format!(
                "{ENTRY} {{\n  let local = linear_id(wid, nwg, lid);\n  if (local >= p[0]) {{ return; }}\n  \
                 let ex = operand_at(1u);\n  let i = p[ex + 2u] + local;\n  \
                 let j = p[ex] + ((i / p[2]) % p[3]) * p[ex + 1u];\n  \
                 if (!id_ok(j, p[5])) {{ if (p[ex + 5u] != 0u) {{ store_out(local, {zero}); }} return; }}\n  \
                 let o = strided(i, p[1], HEAD, operand_at(0u)) + id_at(j) * p[4];\n  \
                 if (o < p[ex + 3u] || o - p[ex + 3u] >= p[ex + 4u]) {{ return; }}\n  \
                 store_out(local, load_x(o - p[ex + 3u]));\n}}\n"
            )
        })?;
        let size = self.dtype.size_in_bytes() as u64;
        let limit = dev.limits.max_storage_buffer_binding_size;
        let align = u64::from(dev.limits.min_storage_buffer_offset_alignment).max(4);
        let chunk_bytes = (limit / align * align).max(align);
        // Whole elements per chunk (a chunk boundary is aligned, so it falls between elements).
        let chunk_elems = (chunk_bytes / size) as usize;
        let src_bytes = self.buf.buffer.size();
        let out_bytes = out.buf.buffer.size();
        let chunks = |bytes: u64, elems: usize| -> Vec<Chunk> {
            if bytes <= limit {
                return vec![(0, elems, None)];
            }
            (0..elems.div_ceil(chunk_elems))
                .map(|c| {
                    let start = c * chunk_elems;
                    let len = chunk_elems.min(elems - start);
                    let from = start as u64 * size;
                    let to = ((start + len) as u64 * size).next_multiple_of(4).min(bytes);
                    (start, len, Some((from, to - from)))
                })
                .collect()
        };
        let src_elems = (src_bytes / size) as usize;
        for (out_start, out_len, out_range) in chunks(out_bytes, count) {
            for (k, &(src_start, src_len, src_range)) in
                chunks(src_bytes, src_elems).iter().enumerate()
            {
                let mut p = Params::new(out_len, &dims)?;
                p.operand(l.offset(), &without(l.strides(), dim))?;
                p.scalar_u32(0, codegen::word(inner)?)
                    .scalar_u32(1, codegen::word(n_ids)?)
                    .scalar_u32(2, codegen::word(l.strides()[dim])?)
                    .scalar_u32(3, codegen::word(l.dims()[dim])?);
                for v in [
                    il.offset(),
                    il.strides().first().copied().unwrap_or(0),
                    out_start,
                    src_start,
                    src_len,
                    usize::from(k == 0),
                ] {
                    p.push(codegen::word(v)?);
                }
                dev.dispatch_ranges(
                    pipeline.clone(),
                    p.bytes(),
                    vec![
                        (self.buf.clone(), src_range),
                        (ids.buf.clone(), None),
                        (out.buf.clone(), out_range),
                    ],
                    dev.grid((out_len as u64).div_ceil(256))?,
                )?;
            }
        }
        Ok(out)
    }

    pub(super) fn gather_impl(
        &self,
        l: &Layout,
        ids: &WgpuStorage,
        il: &Layout,
        dim: usize,
    ) -> Result<WgpuStorage> {
        let dev = self.device_arc();
        let zero = class(dev, self.dtype, "gather")?.zero();
        id_fns(ids.dtype)?;
        let count = il.elem_count();
        let mut p = Params::new(count, il.dims())?;
        p.operand(l.offset(), &without(l.strides(), dim))?
            .operand(il.offset(), il.strides())?;
        p.scalar_u32(0, codegen::word(l.strides()[dim])?)
            .scalar_u32(1, codegen::word(l.dims()[dim])?);
        let out = WgpuStorage::alloc(dev, self.dtype, count)?;
        let key = format!("gather:{:?}:{:?}", self.dtype, ids.dtype);
        let pipeline = self.gather_pipeline(&key, ids.dtype, || {
            format!(
                "{ENTRY} {{\n  let i = linear_id(wid, nwg, lid);\n  if (i >= p[0]) {{ return; }}\n  \
                 let j = strided(i, p[1], HEAD, operand_at(1u));\n  \
                 if (!id_ok(j, p[3])) {{ store_out(i, {zero}); return; }}\n  \
                 store_out(i, load_x(strided(i, p[1], HEAD, operand_at(0u)) + id_at(j) * p[2]));\n}}\n"
            )
        })?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![self.buf.clone(), ids.buf.clone(), out.buf.clone()],
            dev.grid((count as u64).div_ceil(256))?,
        )?;
        Ok(out)
    }

    /// One invocation per line of `ids` along `dim` adds that line's values in order: no
    /// atomics, the same sums on every run.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scatter_add_impl(
        &self,
        l: &Layout,
        ids: &WgpuStorage,
        il: &Layout,
        src: &WgpuStorage,
        sl: &Layout,
        dim: usize,
    ) -> Result<WgpuStorage> {
        let dev = self.device_arc();
        let c: Class = class(dev, self.dtype, "scatter_add")?;
        id_fns(ids.dtype)?;
        let out = self.copy_impl(l, Target::New)?.expect("a new buffer");
        let out_strides = codegen::contiguous_strides(l.dims());
        let mut lines = il.dims().to_vec();
        let len = lines[dim];
        lines[dim] = 1;
        let count: usize = lines.iter().product();
        let mut p = Params::new(count, &lines)?;
        p.operand(il.offset(), il.strides())?
            .operand(sl.offset(), sl.strides())?
            .operand(0, &out_strides)?;
        p.scalar_u32(0, codegen::word(len)?)
            .scalar_u32(1, codegen::word(il.strides()[dim])?)
            .scalar_u32(2, codegen::word(sl.strides()[dim])?)
            .scalar_u32(3, codegen::word(out_strides[dim])?);
        p.push(codegen::word(l.dims()[dim])?);
        let add = binary_expr(BinaryOp::Add, c, "load_out(o)", "load_src(sj + t * p[4])")?;
        let key = format!("scatter_add:{:?}:{:?}", self.dtype, ids.dtype);
        let pipeline = dev.pipeline(&key, || {
            let mut s = prelude(&[self.dtype]);
            s += &binding("ids", 1, ids.dtype, Access::Read);
            s += &binding("src", 2, self.dtype, Access::Read);
            s += &binding("out", 3, self.dtype, Access::ReadWrite);
            s += &id_fns(ids.dtype).expect("checked");
            s += &format!(
                "{ENTRY} {{\n  let i = linear_id(wid, nwg, lid);\n  if (i >= p[0]) {{ return; }}\n  \
                 let ij = strided(i, p[1], HEAD, operand_at(0u));\n  \
                 let sj = strided(i, p[1], HEAD, operand_at(1u));\n  \
                 let ob = strided(i, p[1], HEAD, operand_at(2u));\n  \
                 let size = p[operand_at(3u)];\n  \
                 for (var t = 0u; t < p[2]; t++) {{\n    let j = ij + t * p[3];\n    \
                 if (!id_ok(j, size)) {{ continue; }}\n    let o = ob + id_at(j) * p[5];\n    \
                 store_out(o, {add});\n  }}\n}}\n"
            );
            s
        })?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![ids.buf.clone(), src.buf.clone(), out.buf.clone()],
            dev.grid((count as u64).div_ceil(256))?,
        )?;
        Ok(out)
    }
}
