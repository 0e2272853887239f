// Helpers every kiln shader may call. `p` (binding 0) holds the dispatch's parameters:
// p[0] element or row count, p[1] rank, p[2..6] scalars, p[6..6+rank] the shape, then per
// operand its offset and strides (see `codegen::Params`).

const HEAD: u32 = 6u;

// The invocation's index in a 1-D launch folded into 2-D (see `WgpuDevice::grid`).
fn linear_id(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * 256u + lid;
}

fn group_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// The element offset of row-major index `i` (over the shape at p[shape_at..]) in the operand
// whose offset and strides start at p[at].
// `i` is below the shape's element count, so the outermost dim needs no division (and a
// contiguous operand, collapsed to rank 1, none at all).
fn strided(i: u32, rank: u32, shape_at: u32, at: u32) -> u32 {
    var rem = i;
    var off = p[at];
    for (var d = rank; d > 1u; d--) {
        let s = p[shape_at + d - 1u];
        off += (rem % s) * p[at + d];
        rem = rem / s;
    }
    if (rank > 0u) {
        off += rem * p[at + 1u];
    }
    return off;
}

fn operand_at(k: u32) -> u32 {
    return HEAD + p[1] + k * (p[1] + 1u);
}

fn pf(k: u32) -> f32 {
    return bitcast<f32>(p[2u + k]);
}

fn pu(k: u32) -> u32 {
    return p[2u + k];
}

fn pi64(k: u32) -> vec2<u32> {
    return vec2<u32>(p[2u + k], p[3u + k]);
}

// ---- floats ----

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

fn nan_f32() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn fmaximum(a: f32, b: f32) -> f32 {
    return select(b, a, is_nan(a) || a > b);
}

fn fminimum(a: f32, b: f32) -> f32 {
    return select(b, a, is_nan(a) || a < b);
}

fn frelu(a: f32) -> f32 {
    return select(a, 0.0, a <= 0.0);
}

// powf with C's rules for a negative base and an integral exponent.
fn fpow(a: f32, b: f32) -> f32 {
    if (b == 0.0) {
        return 1.0;
    }
    if (a >= 0.0 || is_nan(a)) {
        return pow(a, b);
    }
    if (trunc(b) != b) {
        return nan_f32();
    }
    let m = pow(-a, b);
    let odd = abs(b) < 16777216.0 && (i32(abs(b)) & 1) == 1;
    return select(m, -m, odd);
}

fn ftanh(x: f32) -> f32 {
    let z = abs(x);
    if (z < 0.3) {
        let z2 = x * x;
        return x * (1.0 + z2 * (-1.0 / 3.0 + z2 * (2.0 / 15.0 + z2 * (-17.0 / 315.0 + z2 * (62.0 / 2835.0 - z2 * (1382.0 / 155925.0))))));
    }
    if (is_nan(x)) {
        return x;
    }
    let e = exp(-2.0 * min(z, 20.0));
    let r = (1.0 - e) / (1.0 + e);
    return select(r, -r, x < 0.0);
}

fn fsigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// erfc(z) for z >= 0, relative error ~1.2e-7 (Numerical Recipes' erfcc).
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(poly);
}

fn ferf(x: f32) -> f32 {
    if (abs(x) < 0.75) {
        let z = x * x;
        let c = 1.1283791671; // 2/sqrt(pi)
        return x * c * (1.0 + z * (-1.0 / 3.0 + z * (1.0 / 10.0 + z * (-1.0 / 42.0 + z * (1.0 / 216.0 + z * (-1.0 / 1320.0 + z * (1.0 / 9360.0 + z * (-1.0 / 75600.0 + z * (1.0 / 685440.0)))))))));
    }
    if (is_nan(x)) {
        return x;
    }
    let r = 1.0 - erfc_pos(abs(x));
    return select(r, -r, x < 0.0);
}

fn fgelu_erf(x: f32) -> f32 {
    let half_erfc = 0.5 * erfc_pos(abs(x) * 0.70710678);
    return select(x * (1.0 - half_erfc), x * half_erfc, x < 0.0);
}

fn fgelu_erf_grad(x: f32) -> f32 {
    let half_erfc = 0.5 * erfc_pos(abs(x) * 0.70710678);
    let cdf = select(1.0 - half_erfc, half_erfc, x < 0.0);
    if (!is_finite(x)) {
        return cdf;
    }
    return cdf + x * exp(-0.5 * x * x) * 0.3989422804;
}

fn fgelu_tanh(x: f32) -> f32 {
    let u = 0.7978845608 * (x + 0.044715 * x * x * x);
    // 0.5·x·(1 + tanh(u)) = x·sigmoid(2u): no cancellation in the negative tail.
    return x * fsigmoid(2.0 * u);
}

fn fgelu_tanh_grad(x: f32) -> f32 {
    // Beyond 1e19 the derivative is 1 or 0, and 0.134145·x² could overflow into 0·inf (as on
    // the CPU). NaN fails both tests and stays NaN.
    if (x > 1e19) {
        return 1.0;
    }
    if (x < -1e19) {
        return 0.0;
    }
    let u = 0.7978845608 * (x + 0.044715 * x * x * x);
    let s = fsigmoid(2.0 * u);
    return s + x * 2.0 * s * (1.0 - s) * 0.7978845608 * (1.0 + 0.134145 * x * x);
}

// Float to integer casts: truncate toward zero and saturate; NaN gives 0.
fn f32_to_u32(v: f32) -> u32 {
    if (is_nan(v) || v <= 0.0) {
        return 0u;
    }
    if (v >= 4294967296.0) {
        return 0xffffffffu;
    }
    return u32(trunc(v));
}

fn f32_to_u8(v: f32) -> u32 {
    if (is_nan(v) || v <= 0.0) {
        return 0u;
    }
    return u32(trunc(min(v, 255.0)));
}

// ---- i64 as vec2<u32>(low word, high word), two's complement ----

fn i64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn i64_neg(a: vec2<u32>) -> vec2<u32> {
    return i64_add(~a, vec2<u32>(1u, 0u));
}

fn i64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return i64_add(a, i64_neg(b));
}

fn mul32_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

fn i64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let w = mul32_wide(a.x, b.x);
    return vec2<u32>(w.x, w.y + a.x * b.y + a.y * b.x);
}

fn i64_is_neg(a: vec2<u32>) -> bool {
    return (a.y >> 31u) == 1u;
}

fn i64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    if (a.y != b.y) {
        return bitcast<i32>(a.y) < bitcast<i32>(b.y);
    }
    return a.x < b.x;
}

fn i64_eq(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x == b.x && a.y == b.y;
}

fn i64_abs(a: vec2<u32>) -> vec2<u32> {
    return select(a, i64_neg(a), i64_is_neg(a));
}

fn i64_max(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return select(a, b, i64_lt(a, b));
}

fn i64_min(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return select(a, b, i64_lt(b, a));
}

fn u64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

// Truncating division; division by zero gives 0 (as the CPU backend).
fn i64_div(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (b.x == 0u && b.y == 0u) {
        return vec2<u32>(0u, 0u);
    }
    let n = i64_abs(a);
    let d = i64_abs(b);
    var q = vec2<u32>(0u, 0u);
    var r = vec2<u32>(0u, 0u);
    for (var i = 63; i >= 0; i--) {
        let word = select(n.x, n.y, i >= 32);
        let bit = (word >> (u32(i) & 31u)) & 1u;
        r = vec2<u32>((r.x << 1u) | bit, (r.y << 1u) | (r.x >> 31u));
        if (!u64_lt(r, d)) {
            r = i64_sub(r, d);
            if (i >= 32) {
                q.y |= 1u << (u32(i) - 32u);
            } else {
                q.x |= 1u << u32(i);
            }
        }
    }
    return select(q, i64_neg(q), i64_is_neg(a) != i64_is_neg(b));
}

fn i64_from_i32(v: i32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0));
}

fn i64_to_f32(a: vec2<u32>) -> f32 {
    if (i64_is_neg(a)) {
        let m = i64_neg(a);
        return -(f32(m.y) * 4294967296.0 + f32(m.x));
    }
    return f32(a.y) * 4294967296.0 + f32(a.x);
}

fn i64_from_f32(v: f32) -> vec2<u32> {
    if (is_nan(v)) {
        return vec2<u32>(0u, 0u);
    }
    let t = trunc(abs(v));
    if (t >= 9223372036854775808.0) {
        return select(vec2<u32>(0xffffffffu, 0x7fffffffu), vec2<u32>(0u, 0x80000000u), v < 0.0);
    }
    let hi = floor(t / 4294967296.0);
    let r = vec2<u32>(u32(t - hi * 4294967296.0), u32(hi));
    return select(r, i64_neg(r), v < 0.0);
}
