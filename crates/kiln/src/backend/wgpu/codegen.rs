//! WGSL generation: how each dtype is stored and loaded, the dispatch parameters (shape,
//! offsets and strides of every operand) and the shader prelude every kernel shares.
//!
//! Storage per dtype: f32 and f16 (`SHADER_F16`) natively, u32 natively, u8 packed four to a
//! word (writes through atomics, so neighbouring bytes written by other invocations are
//! kept), i64 as two words (low, high). Values are computed in a *class*: f32 for the
//! floats, u32 for u8/u32 (u8 wraps when stored), `vec2<u32>` for i64 (see `common.wgsl`).

use super::context::WgpuDevice;
use crate::layout::Layout;
use crate::{DType, Error, Result};

pub(super) const COMMON: &str = include_str!("shaders/common.wgsl");

/// The arithmetic class values of a dtype are computed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Float,
    Uint,
    Int64,
}

impl Class {
    pub fn wgsl(self) -> &'static str {
        match self {
            Class::Float => "f32",
            Class::Uint => "u32",
            Class::Int64 => "vec2<u32>",
        }
    }

    pub fn zero(self) -> &'static str {
        match self {
            Class::Float => "0.0",
            Class::Uint => "0u",
            Class::Int64 => "vec2<u32>(0u, 0u)",
        }
    }
}

/// The class of `dtype` on `dev`, or [`Error::UnsupportedDType`] naming `op`.
pub(super) fn class(dev: &WgpuDevice, dtype: DType, op: &'static str) -> Result<Class> {
    match dtype {
        DType::F32 => Ok(Class::Float),
        DType::F16 if dev.f16 => Ok(Class::Float),
        DType::U32 | DType::U8 => Ok(Class::Uint),
        DType::I64 => Ok(Class::Int64),
        _ => Err(Error::UnsupportedDType { op, dtype }),
    }
}

/// Bytes of a buffer holding `len` elements of `dtype` (whole words).
pub(super) fn buffer_bytes(dtype: DType, len: usize) -> u64 {
    ((len * dtype.size_in_bytes()) as u64)
        .next_multiple_of(4)
        .max(4)
}

/// How a shader may use a binding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    ReadWrite,
}

/// The declaration of binding `binding` named `name` holding `dtype`, with its accessors
/// `load_NAME(j) -> class` and (read-write) `store_NAME(j, v)`.
pub(super) fn binding(name: &str, binding: u32, dtype: DType, access: Access) -> String {
    let rw = access == Access::ReadWrite;
    let mode = if rw { "read_write" } else { "read" };
    let decl = |ty: &str| {
        format!("@group(0) @binding({binding}) var<storage, {mode}> {name}: array<{ty}>;\n")
    };
    let mut s = String::new();
    match dtype {
        DType::F32 | DType::F16 | DType::U32 => {
            let (ty, load, store) = match dtype {
                DType::F32 => ("f32", format!("{name}[j]"), "v".to_string()),
                DType::F16 => ("f16", format!("f32({name}[j])"), "f16(v)".to_string()),
                _ => ("u32", format!("{name}[j]"), "v".to_string()),
            };
            s += &decl(ty);
            let c = if ty == "u32" { "u32" } else { "f32" };
            s += &format!("fn load_{name}(j: u32) -> {c} {{ return {load}; }}\n");
            if rw {
                s += &format!("fn store_{name}(j: u32, v: {c}) {{ {name}[j] = {store}; }}\n");
            }
        }
        DType::U8 if rw => {
            s += &decl("atomic<u32>");
            s += &format!(
                "fn load_{name}(j: u32) -> u32 {{ return (atomicLoad(&{name}[j >> 2u]) >> ((j & 3u) * 8u)) & 255u; }}\n\
                 fn store_{name}(j: u32, v: u32) {{ let sh = (j & 3u) * 8u; \
                 atomicAnd(&{name}[j >> 2u], ~(255u << sh)); atomicOr(&{name}[j >> 2u], (v & 255u) << sh); }}\n"
            );
        }
        DType::U8 => {
            s += &decl("u32");
            s += &format!(
                "fn load_{name}(j: u32) -> u32 {{ return ({name}[j >> 2u] >> ((j & 3u) * 8u)) & 255u; }}\n"
            );
        }
        DType::I64 => {
            s += &decl("u32");
            s += &format!(
                "fn load_{name}(j: u32) -> vec2<u32> {{ return vec2<u32>({name}[2u * j], {name}[2u * j + 1u]); }}\n"
            );
            if rw {
                s += &format!(
                    "fn store_{name}(j: u32, v: vec2<u32>) {{ {name}[2u * j] = v.x; {name}[2u * j + 1u] = v.y; }}\n"
                );
            }
        }
        DType::BF16 | DType::F64 => unreachable!("refused by `class`"),
    }
    s
}

/// The start of every shader: `enable f16` when needed, the parameter binding and the
/// shared helpers.
pub(super) fn prelude(dtypes: &[DType]) -> String {
    let mut s = String::new();
    if dtypes.contains(&DType::F16) {
        s += "enable f16;\n";
    }
    s += "@group(0) @binding(0) var<storage, read> p: array<u32>;\n";
    s += COMMON;
    s
}

/// The compute entry point's signature with the builtins kiln's shaders use.
pub(super) const ENTRY: &str = "@compute @workgroup_size(256)\n\
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, \
@builtin(local_invocation_index) lid: u32)";

/// A dispatch's parameters (see `common.wgsl`): count, rank, four scalar slots, the shape,
/// then each operand's offset and strides.
pub(super) struct Params {
    pub words: Vec<u32>,
}

impl Params {
    /// Parameters over `dims` (elements, rows, ...) counting `count` items.
    pub fn new(count: usize, dims: &[usize]) -> Result<Params> {
        let mut words = vec![word(count)?, dims.len() as u32, 0, 0, 0, 0];
        for &d in dims {
            words.push(word(d)?);
        }
        Ok(Params { words })
    }

    /// Appends an operand's offset and strides (over the same dims).
    pub fn operand(&mut self, offset: usize, strides: &[usize]) -> Result<&mut Self> {
        self.words.push(word(offset)?);
        for &s in strides {
            self.words.push(word(s)?);
        }
        Ok(self)
    }

    pub fn scalar_u32(&mut self, slot: usize, v: u32) -> &mut Self {
        self.words[2 + slot] = v;
        self
    }

    pub fn scalar_f32(&mut self, slot: usize, v: f32) -> &mut Self {
        self.scalar_u32(slot, v.to_bits())
    }

    pub fn scalar_i64(&mut self, slot: usize, v: i64) -> &mut Self {
        self.scalar_u32(slot, v as u32);
        self.scalar_u32(slot + 1, (v >> 32) as u32)
    }

    /// A value of `class` (scalar of an element-wise op), `dtype`'s conversion of `v`.
    pub fn scalar_of(&mut self, slot: usize, v: f64, dtype: DType) -> &mut Self {
        use crate::dtype::WithDType;
        match dtype {
            DType::U8 => self.scalar_u32(slot, u32::from(u8::from_f64(v))),
            DType::U32 => self.scalar_u32(slot, u32::from_f64(v)),
            DType::I64 => self.scalar_i64(slot, i64::from_f64(v)),
            _ => self.scalar_f32(slot, v as f32),
        }
    }

    /// Extra words after the operands (a kernel's own table).
    pub fn push(&mut self, v: u32) -> &mut Self {
        self.words.push(v);
        self
    }

    pub fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.words)
    }
}

/// `v` as a shader word, or an error: kiln's shaders index with 32-bit integers.
pub(super) fn word(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Msg(format!(
            "wgpu: {v} does not fit the 32-bit indices of kiln's shaders (tensors on wgpu hold \
             fewer than 2^32 elements)"
        ))
    })
}

/// Merges adjacent dims that every layout (all of one shape) walks as one, and drops dims
/// of extent 1: the shape and each layout's strides, as short as they can be. An empty
/// shape becomes `[1]`.
pub(super) fn collapse(dims: &[usize], layouts: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut shape: Vec<usize> = Vec::new();
    let mut strides: Vec<Vec<usize>> = vec![Vec::new(); layouts.len()];
    for (d, &size) in dims.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let mergeable = !shape.is_empty()
            && layouts.iter().zip(&strides).all(|(l, s)| {
                let inner = *s.last().expect("a previous dim");
                inner == l[d] * size
            });
        if mergeable {
            *shape.last_mut().expect("a previous dim") *= size;
            for (l, s) in layouts.iter().zip(strides.iter_mut()) {
                *s.last_mut().expect("a previous dim") = l[d];
            }
        } else {
            shape.push(size);
            for (l, s) in layouts.iter().zip(strides.iter_mut()) {
                s.push(l[d]);
            }
        }
    }
    if shape.is_empty() {
        shape.push(1);
        for s in strides.iter_mut() {
            s.push(0);
        }
    }
    (shape, strides)
}

/// Row-major strides of `dims`.
pub(super) fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

/// The element-wise parameters of `layouts` (one shape) plus a contiguous output (`out`
/// given: that layout instead).
pub(super) fn elementwise_params(layouts: &[&Layout], out: Option<&Layout>) -> Result<Params> {
    let dims = layouts[0].dims();
    let cont = contiguous_strides(dims);
    let mut all: Vec<&[usize]> = layouts.iter().map(|l| l.strides()).collect();
    all.push(out.map_or(&cont[..], |o| o.strides()));
    let (shape, strides) = collapse(dims, &all);
    let mut p = Params::new(layouts[0].elem_count(), &shape)?;
    for (l, s) in layouts.iter().zip(&strides) {
        p.operand(l.offset(), s)?;
    }
    p.operand(
        out.map_or(0, |o| o.offset()),
        strides.last().expect("output"),
    )?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_merges_contiguous_runs_and_keeps_views() {
        // A contiguous [2, 3, 4] is one run of 24.
        let (s, st) = collapse(&[2, 3, 4], &[&[12, 4, 1]]);
        assert_eq!((s, st), (vec![24], vec![vec![1]]));
        // Its transpose of the last two dims cannot merge them.
        let (s, st) = collapse(&[2, 4, 3], &[&[12, 1, 4], &[12, 3, 1]]);
        assert_eq!(s, vec![2, 4, 3]);
        assert_eq!(st, vec![vec![12, 1, 4], vec![12, 3, 1]]);
        // Broadcast (stride 0) dims and extent-1 dims.
        let (s, st) = collapse(&[1, 5, 1, 2], &[&[99, 0, 7, 1]]);
        assert_eq!((s, st), (vec![5, 2], vec![vec![0, 1]]));
        let (s, st) = collapse(&[], &[&[]]);
        assert_eq!((s, st), (vec![1], vec![vec![0]]));
    }
}
