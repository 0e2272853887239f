//! Element-wise kernels on any layout: unary and binary arithmetic, comparisons, select,
//! casts and copies. One generated shader per (expression, dtypes, target), cached.

use super::codegen::{self, binding, class, elementwise_params, prelude, Access, Class, Params};
use super::WgpuStorage;
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, UnaryOp};
use crate::{DType, Error, Result};

/// Where an element-wise kernel writes.
pub(super) enum Target<'a> {
    /// A new contiguous buffer.
    New,
    /// The first input's own storage, at its layout (in place).
    First,
    /// Another storage at a layout of the same shape.
    Into(&'a WgpuStorage, &'a Layout),
}

/// Runs `expr` (WGSL over the loaded inputs `a`, `b`, `c` and the scalar slots) on every
/// element of `inputs` (layouts of one shape), storing it as `out_dtype` at `target`.
/// `key` names the expression; dtypes and target are added to the pipeline key.
pub(super) fn map(
    key: &str,
    inputs: &[(&WgpuStorage, &Layout)],
    target: Target<'_>,
    out_dtype: DType,
    expr: &str,
    scalars: &dyn Fn(&mut Params),
) -> Result<Option<WgpuStorage>> {
    // A shader cannot bind one buffer both read-only and read-write: an input that shares
    // the output's buffer is copied first.
    let dst = match &target {
        Target::New => None,
        Target::First => Some(inputs[0].0),
        Target::Into(d, _) => Some(*d),
    };
    let skip = usize::from(matches!(target, Target::First));
    let copies: Vec<Option<(WgpuStorage, Layout)>> = inputs
        .iter()
        .enumerate()
        .map(|(k, (s, l))| match dst {
            Some(d) if k >= skip && std::sync::Arc::ptr_eq(&d.buf, &s.buf) => {
                let c = map("copy", &[(*s, *l)], Target::New, s.dtype, "a", &|_| {})?;
                Ok(Some((
                    c.expect("a new buffer"),
                    Layout::contiguous(l.shape().clone()),
                )))
            }
            _ => Ok(None),
        })
        .collect::<Result<_>>()?;
    let inputs: Vec<(&WgpuStorage, &Layout)> = inputs
        .iter()
        .zip(&copies)
        .map(|(orig, c)| c.as_ref().map_or(*orig, |(s, l)| (s, l)))
        .collect();
    let inputs = &inputs[..];
    let first = inputs[0].0;
    let dev = &first.buf.device;
    let n = inputs[0].1.elem_count();
    let names = ["a", "b", "c"];
    let (out_layout, target_tag) = match &target {
        Target::New => (None, "new"),
        Target::First => (Some(inputs[0].1), "first"),
        Target::Into(_, l) => (Some(*l), "into"),
    };
    let layouts: Vec<&Layout> = inputs.iter().map(|(_, l)| *l).collect();
    let mut params = elementwise_params(&layouts, out_layout)?;
    scalars(&mut params);
    let mut dtypes: Vec<DType> = inputs.iter().map(|(s, _)| s.dtype).collect();
    dtypes.push(out_dtype);
    // Rank 1 after collapsing (contiguous operands, scalars broadcast): four elements per
    // invocation with the offsets and strides read once, no index arithmetic per element.
    let flat = params.words[1] == 1;
    if flat && matches!(target, Target::New) && vec4_ok(inputs, &dtypes, &params) {
        let out = WgpuStorage::alloc(dev, out_dtype, n)?;
        map_vec4(key, inputs, &out, expr, &params)?;
        return Ok(Some(out));
    }
    let full_key = format!("map:{key}:{dtypes:?}:{target_tag}:{flat}");
    let pipeline = dev.pipeline(&full_key, || {
        let mut src = prelude(&dtypes);
        let skip_first = matches!(target, Target::First);
        let mut next = 1;
        for (k, (s, _)) in inputs.iter().enumerate() {
            if k == 0 && skip_first {
                continue;
            }
            src += &binding(names[k], next, s.dtype, Access::Read);
            next += 1;
        }
        src += &binding("out", next, out_dtype, Access::ReadWrite);
        if skip_first {
            let c = class_name(inputs[0].0.dtype);
            src += &format!("fn load_a(j: u32) -> {c} {{ return load_out(j); }}\n");
        }
        src += codegen::ENTRY;
        if flat {
            src += " {\n  let n = p[0];\n";
            for k in 0..=inputs.len() {
                src += &format!("  let o{k} = p[{}u];\n  let s{k} = p[{}u];\n", 7 + 2 * k, 8 + 2 * k);
            }
            src += "  let base = group_id(wid, nwg) * 1024u + lid;\n  for (var e = 0u; e < 4u; e++) {\n    let i = base + e * 256u;\n    if (i >= n) { break; }\n";
            for (k, name) in names.iter().enumerate().take(inputs.len()) {
                src += &format!("    let {name} = load_{name}(o{k} + i * s{k});\n");
            }
            let k = inputs.len();
            src += &format!("    store_out(o{k} + i * s{k}, {expr});\n  }}\n}}\n");
            return src;
        }
        src += " {\n  let i = linear_id(wid, nwg, lid);\n  if (i >= p[0]) { return; }\n  let rank = p[1];\n";
        for (k, name) in names.iter().enumerate().take(inputs.len()) {
            src += &format!("  let {name} = load_{name}(strided(i, rank, HEAD, operand_at({k}u)));\n");
        }
        src += &format!(
            "  store_out(strided(i, rank, HEAD, operand_at({}u)), {expr});\n}}\n",
            inputs.len()
        );
        src
    })?;
    let mut buffers = Vec::with_capacity(4);
    for (k, (s, _)) in inputs.iter().enumerate() {
        if k == 0 && matches!(target, Target::First) {
            continue;
        }
        buffers.push(s.buf.clone());
    }
    let (out, result) = match target {
        Target::New => {
            let o = WgpuStorage::alloc(dev, out_dtype, n)?;
            (o.buf.clone(), Some(o))
        }
        Target::First => (first.buf.clone(), None),
        Target::Into(dst, _) => (dst.buf.clone(), None),
    };
    buffers.push(out);
    let per_group = if flat { 1024 } else { 256 };
    let groups = dev.grid((n as u64).div_ceil(per_group))?;
    dev.dispatch(pipeline, params.bytes(), buffers, groups)?;
    Ok(result)
}

/// Whether the vec4 kernels are on (`KILN_WGPU_VEC4=0` turns them off, to compare).
fn vec4_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_WGPU_VEC4").map_or(true, |v| v.trim() != "0"))
}

/// Whether a flat (rank-1) f32 map can read and write whole `vec4<f32>`s: every input
/// contiguous (stride 1) from an offset that is a multiple of 4, in a buffer of whole
/// vec4s (pool buffers are multiples of 512 bytes, so the last vec4 never leaves them).
fn vec4_ok(inputs: &[(&WgpuStorage, &Layout)], dtypes: &[DType], params: &Params) -> bool {
    vec4_enabled()
        && dtypes.iter().all(|&d| d == DType::F32)
        && inputs.iter().enumerate().all(|(k, (s, _))| {
            let (offset, stride) = (params.words[7 + 2 * k], params.words[8 + 2 * k]);
            stride == 1 && offset % 4 == 0 && s.buf.buffer.size() % 16 == 0
        })
}

/// [`map`] on contiguous f32 operands into a new buffer, one `vec4<f32>` per invocation:
/// 16-byte loads and stores, no per-element index arithmetic (the expression is applied to
/// each component; the last vec4 may run past `n` inside the output's padding).
fn map_vec4(
    key: &str,
    inputs: &[(&WgpuStorage, &Layout)],
    out: &WgpuStorage,
    expr: &str,
    params: &Params,
) -> Result<()> {
    let names = ["a", "b", "c"];
    let dev = out.device_arc();
    let pipeline = dev.pipeline(&format!("map4:{key}:{}", inputs.len()), || {
        let mut src = prelude(&[DType::F32]);
        for (k, name) in names.iter().enumerate().take(inputs.len()) {
            src += &format!(
                "@group(0) @binding({}) var<storage, read> {name}4: array<vec4<f32>>;\n",
                k + 1
            );
        }
        src += &format!(
            "@group(0) @binding({}) var<storage, read_write> out4: array<vec4<f32>>;\n",
            inputs.len() + 1
        );
        src += codegen::ENTRY;
        src += " {\n  let q = linear_id(wid, nwg, lid);\n  if (q * 4u >= p[0]) { return; }\n";
        for (k, name) in names.iter().enumerate().take(inputs.len()) {
            src += &format!("  let v{name} = {name}4[p[{}u] / 4u + q];\n", 7 + 2 * k);
        }
        // One scope per component, named statically: a vector indexed by a loop variable
        // may be spilled to local memory to be indexed.
        src += "  var r: vec4<f32>;\n";
        for comp in ["x", "y", "z", "w"] {
            src += "  {\n";
            for name in names.iter().take(inputs.len()) {
                src += &format!("    let {name} = v{name}.{comp};\n");
            }
            src += &format!("    r.{comp} = {expr};\n  }}\n");
        }
        src += "  out4[q] = r;\n}\n";
        src
    })?;
    let mut buffers: Vec<_> = inputs.iter().map(|(s, _)| s.buf.clone()).collect();
    buffers.push(out.buf.clone());
    let n = out.len as u64;
    dev.dispatch(
        pipeline,
        params.bytes(),
        buffers,
        dev.grid(n.div_ceil(4).div_ceil(256))?,
    )
}

/// The WGSL type values of `dtype` are computed in (before `class` has checked support).
fn class_name(dtype: DType) -> &'static str {
    match dtype {
        DType::U8 | DType::U32 => "u32",
        DType::I64 => "vec2<u32>",
        _ => "f32",
    }
}

/// `op` on the class's values `a` and `b` as WGSL.
pub(super) fn binary_expr(op: BinaryOp, c: Class, a: &str, b: &str) -> Result<String> {
    Ok(match (c, op) {
        (Class::Float, BinaryOp::Add) | (Class::Uint, BinaryOp::Add) => format!("({a} + {b})"),
        (Class::Float, BinaryOp::Sub) | (Class::Uint, BinaryOp::Sub) => format!("({a} - {b})"),
        (Class::Float, BinaryOp::Mul) | (Class::Uint, BinaryOp::Mul) => format!("({a} * {b})"),
        (Class::Float, BinaryOp::Div) => format!("({a} / {b})"),
        (Class::Uint, BinaryOp::Div) => format!("select(0u, {a} / max({b}, 1u), {b} != 0u)"),
        (Class::Float, BinaryOp::Maximum) => format!("fmaximum({a}, {b})"),
        (Class::Float, BinaryOp::Minimum) => format!("fminimum({a}, {b})"),
        (Class::Uint, BinaryOp::Maximum) => format!("max({a}, {b})"),
        (Class::Uint, BinaryOp::Minimum) => format!("min({a}, {b})"),
        (Class::Float, BinaryOp::Pow) => format!("fpow({a}, {b})"),
        (Class::Float, BinaryOp::ReluGrad) => format!("select(0.0, {a}, {b} > 0.0)"),
        (Class::Uint, BinaryOp::ReluGrad) => format!("select(0u, {a}, {b} > 0u)"),
        (Class::Float, BinaryOp::AddRelu) => format!("frelu({a} + {b})"),
        (Class::Float, BinaryOp::MulRelu) => format!("frelu({a} * {b})"),
        // Unsigned values are never negative: ReLU keeps them.
        (Class::Uint, BinaryOp::AddRelu) => format!("({a} + {b})"),
        (Class::Uint, BinaryOp::MulRelu) => format!("({a} * {b})"),
        (Class::Float, BinaryOp::CountFinite) => format!("select({a}, {a} + 1.0, is_finite({b}))"),
        (Class::Uint, BinaryOp::CountFinite) => format!("({a} + 1u)"),
        (Class::Int64, BinaryOp::Add) => format!("i64_add({a}, {b})"),
        (Class::Int64, BinaryOp::Sub) => format!("i64_sub({a}, {b})"),
        (Class::Int64, BinaryOp::Mul) => format!("i64_mul({a}, {b})"),
        (Class::Int64, BinaryOp::Div) => format!("i64_div({a}, {b})"),
        (Class::Int64, BinaryOp::Maximum) => format!("i64_max({a}, {b})"),
        (Class::Int64, BinaryOp::Minimum) => format!("i64_min({a}, {b})"),
        (Class::Int64, BinaryOp::ReluGrad) => {
            format!("select(vec2<u32>(0u, 0u), {a}, i64_lt(vec2<u32>(0u, 0u), {b}))")
        }
        (Class::Int64, BinaryOp::AddRelu) => {
            format!("i64_max(i64_add({a}, {b}), vec2<u32>(0u, 0u))")
        }
        (Class::Int64, BinaryOp::MulRelu) => {
            format!("i64_max(i64_mul({a}, {b}), vec2<u32>(0u, 0u))")
        }
        (Class::Int64, BinaryOp::CountFinite) => format!("i64_add({a}, vec2<u32>(1u, 0u))"),
        (_, BinaryOp::Pow) => return Err(int_refused(op.name())),
    })
}

fn int_refused(op: &'static str) -> Error {
    Error::Msg(format!("{op}: integer dtypes are not supported"))
}

/// `op` on `a` as WGSL (scalar slots 0.. hold its constants).
fn unary_expr(op: UnaryOp, c: Class) -> Result<String> {
    let f = |s: &str| Ok(s.to_string());
    match (c, op) {
        (Class::Float, UnaryOp::Neg) => f("-a"),
        (Class::Float, UnaryOp::Abs) => f("abs(a)"),
        (Class::Float, UnaryOp::Sqr) => f("a * a"),
        (Class::Float, UnaryOp::Relu) => f("frelu(a)"),
        (Class::Float, UnaryOp::Exp) => f("exp(a)"),
        (Class::Float, UnaryOp::Log) => f("log(a)"),
        (Class::Float, UnaryOp::Sqrt) => f("sqrt(a)"),
        (Class::Float, UnaryOp::Recip) => f("1.0 / a"),
        (Class::Float, UnaryOp::Sin) => f("sin(a)"),
        (Class::Float, UnaryOp::Cos) => f("cos(a)"),
        (Class::Float, UnaryOp::Tanh) => f("ftanh(a)"),
        (Class::Float, UnaryOp::Sigmoid) => f("fsigmoid(a)"),
        (Class::Float, UnaryOp::Erf) => f("ferf(a)"),
        (Class::Float, UnaryOp::GeluErf) => f("fgelu_erf(a)"),
        (Class::Float, UnaryOp::GeluTanh) => f("fgelu_tanh(a)"),
        (Class::Float, UnaryOp::Silu) => f("a * fsigmoid(a)"),
        (Class::Float, UnaryOp::GeluErfGrad) => f("fgelu_erf_grad(a)"),
        (Class::Float, UnaryOp::GeluTanhGrad) => f("fgelu_tanh_grad(a)"),
        (Class::Float, UnaryOp::Clamp(..)) => {
            // The CPU's order: the upper bound first, then the lower; NaN passes through.
            f("select(select(a, pf(1u), a >= pf(1u)), pf(0u), select(a, pf(1u), a >= pf(1u)) <= pf(0u))")
        }
        (Class::Uint, UnaryOp::Neg) => f("0u - a"),
        (Class::Uint, UnaryOp::Abs) | (Class::Uint, UnaryOp::Relu) => f("a"),
        (Class::Uint, UnaryOp::Sqr) => f("a * a"),
        (Class::Uint, UnaryOp::Clamp(..)) => f("max(min(a, pu(1u)), pu(0u))"),
        (Class::Int64, UnaryOp::Neg) => f("i64_neg(a)"),
        (Class::Int64, UnaryOp::Abs) => f("i64_abs(a)"),
        (Class::Int64, UnaryOp::Sqr) => f("i64_mul(a, a)"),
        (Class::Int64, UnaryOp::Relu) => f("i64_max(a, vec2<u32>(0u, 0u))"),
        (Class::Int64, UnaryOp::Clamp(..)) => f("i64_max(i64_min(a, pi64(2u)), pi64(0u))"),
        (
            _,
            UnaryOp::Scalar {
                op,
                reversed,
                value: _,
            },
        ) => {
            let s = match c {
                Class::Float => "pf(0u)",
                Class::Uint => "pu(0u)",
                Class::Int64 => "pi64(0u)",
            };
            if reversed {
                binary_expr(op, c, s, "a")
            } else {
                binary_expr(op, c, "a", s)
            }
        }
        (_, op) => Err(int_refused(op.name())),
    }
}

/// A stable pipeline key of a unary op (its constants travel as parameters).
fn unary_key(op: UnaryOp) -> String {
    match op {
        UnaryOp::Scalar { op, reversed, .. } => format!("scalar:{op:?}:{reversed}"),
        UnaryOp::Clamp(..) => "clamp".into(),
        other => format!("{other:?}"),
    }
}

impl WgpuStorage {
    /// `len` elements of `dtype` equal to `value` (converted as the dtype converts).
    pub(super) fn fill(
        dev: &std::sync::Arc<super::WgpuDevice>,
        value: f64,
        len: usize,
        dtype: DType,
    ) -> Result<WgpuStorage> {
        let c = class(dev, dtype, "full")?;
        let out = WgpuStorage::alloc(dev, dtype, len)?;
        let mut p = Params::new(len, &[])?;
        p.scalar_of(0, value, dtype);
        let v = match c {
            Class::Float => "pf(0u)",
            Class::Uint => "pu(0u)",
            Class::Int64 => "pi64(0u)",
        };
        let pipeline = dev.pipeline(&format!("fill:{dtype:?}"), || {
            let mut s = prelude(&[dtype]);
            s += &binding("out", 1, dtype, Access::ReadWrite);
            s += &format!(
                "{} {{\n  let i = linear_id(wid, nwg, lid);\n  if (i < p[0]) {{ store_out(i, {v}); }}\n}}\n",
                codegen::ENTRY
            );
            s
        })?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![out.buf.clone()],
            dev.grid((len as u64).div_ceil(256))?,
        )?;
        Ok(out)
    }

    pub(super) fn unary_impl(&self, l: &Layout, op: UnaryOp) -> Result<WgpuStorage> {
        let c = class(&self.buf.device, self.dtype, op.name())?;
        let expr = unary_expr(op, c)?;
        let dtype = self.dtype;
        map(
            &unary_key(op),
            &[(self, l)],
            Target::New,
            dtype,
            &expr,
            &|p| match op {
                UnaryOp::Clamp(lo, hi) => {
                    p.scalar_of(0, lo, dtype);
                    p.scalar_of(2, hi, dtype);
                    if c != Class::Int64 {
                        p.scalar_of(1, hi, dtype);
                    }
                }
                UnaryOp::Scalar { value, .. } => {
                    p.scalar_of(0, value, dtype);
                }
                _ => {}
            },
        )
        .map(|o| o.expect("a new buffer"))
    }

    pub(super) fn binary_impl(
        &self,
        l: &Layout,
        rhs: &WgpuStorage,
        rl: &Layout,
        op: BinaryOp,
        target: Target<'_>,
    ) -> Result<Option<WgpuStorage>> {
        let c = class(&self.buf.device, self.dtype, op.name())?;
        let expr = binary_expr(op, c, "a", "b")?;
        map(
            &format!("{op:?}"),
            &[(self, l), (rhs, rl)],
            target,
            self.dtype,
            &expr,
            &|_| {},
        )
    }

    pub(super) fn compare_impl(
        &self,
        l: &Layout,
        rhs: &WgpuStorage,
        rl: &Layout,
        op: CmpOp,
    ) -> Result<WgpuStorage> {
        let c = class(&self.buf.device, self.dtype, op.name())?;
        let test = match (c, op) {
            (Class::Int64, CmpOp::Eq) => "i64_eq(a, b)",
            (Class::Int64, CmpOp::Ne) => "!i64_eq(a, b)",
            (Class::Int64, CmpOp::Lt) => "i64_lt(a, b)",
            (Class::Int64, CmpOp::Le) => "!i64_lt(b, a)",
            (Class::Int64, CmpOp::Gt) => "i64_lt(b, a)",
            (Class::Int64, CmpOp::Ge) => "!i64_lt(a, b)",
            (_, CmpOp::Eq) => "a == b",
            (_, CmpOp::Ne) => "!(a == b)",
            (_, CmpOp::Lt) => "a < b",
            (_, CmpOp::Le) => "a <= b",
            (_, CmpOp::Gt) => "a > b",
            (_, CmpOp::Ge) => "a >= b",
        };
        map(
            &format!("{op:?}"),
            &[(self, l), (rhs, rl)],
            Target::New,
            DType::U8,
            &format!("select(0u, 1u, {test})"),
            &|_| {},
        )
        .map(|o| o.expect("a new buffer"))
    }

    pub(super) fn where_impl(
        &self,
        l: &Layout,
        t: &WgpuStorage,
        tl: &Layout,
        f: &WgpuStorage,
        fl: &Layout,
    ) -> Result<WgpuStorage> {
        let dev = &self.buf.device;
        let cond = match class(dev, self.dtype, "where_cond")? {
            Class::Float => "a != 0.0",
            Class::Uint => "a != 0u",
            Class::Int64 => "(a.x | a.y) != 0u",
        };
        class(dev, t.dtype, "where_cond")?;
        map(
            "where",
            &[(self, l), (t, tl), (f, fl)],
            Target::New,
            t.dtype,
            &format!("select(c, b, {cond})"),
            &|_| {},
        )
        .map(|o| o.expect("a new buffer"))
    }

    pub(super) fn cast_impl(&self, l: &Layout, dtype: DType) -> Result<WgpuStorage> {
        let dev = &self.buf.device;
        let from = class(dev, self.dtype, "cast")?;
        let to = class(dev, dtype, "cast")?;
        let expr = match (from, to, dtype) {
            (Class::Float, Class::Float, _) => "a",
            (Class::Float, Class::Uint, DType::U8) => "f32_to_u8(a)",
            (Class::Float, Class::Uint, _) => "f32_to_u32(a)",
            (Class::Float, Class::Int64, _) => "i64_from_f32(a)",
            (Class::Uint, Class::Float, _) => "f32(a)",
            (Class::Uint, Class::Uint, _) => "a",
            (Class::Uint, Class::Int64, _) => "vec2<u32>(a, 0u)",
            (Class::Int64, Class::Float, _) => "i64_to_f32(a)",
            (Class::Int64, Class::Uint, _) => "a.x",
            (Class::Int64, Class::Int64, _) => "a",
        };
        map("cast", &[(self, l)], Target::New, dtype, expr, &|_| {})
            .map(|o| o.expect("a new buffer"))
    }

    pub(super) fn copy_impl(&self, l: &Layout, target: Target<'_>) -> Result<Option<WgpuStorage>> {
        class(&self.buf.device, self.dtype, "copy")?;
        map("copy", &[(self, l)], target, self.dtype, "a", &|_| {})
    }

    pub(super) fn affine_impl(
        &self,
        l: &Layout,
        scale: &WgpuStorage,
        sl: &Layout,
        shift: &WgpuStorage,
        hl: &Layout,
    ) -> Result<WgpuStorage> {
        let c = class(&self.buf.device, self.dtype, "affine")?;
        let expr = binary_expr(
            BinaryOp::Add,
            c,
            &binary_expr(BinaryOp::Mul, c, "a", "b")?,
            "c",
        )?;
        map(
            "affine",
            &[(self, l), (scale, sl), (shift, hl)],
            Target::New,
            self.dtype,
            &expr,
            &|_| {},
        )
        .map(|o| o.expect("a new buffer"))
    }
}
