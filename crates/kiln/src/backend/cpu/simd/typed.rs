//! The slice kernels per float type: f32 directly, f16 and bf16 staged through f32 stack
//! buffers (compute in f32, round once), f64 in plain loops (the compiler vectorises the
//! arithmetic; transcendental functions stay scalar calls to the f64 library functions).

use super::kernels::{self, STAGE};
use crate::backend::cpu::elem::FloatElem;
use crate::backend::cpu::elementwise::scalar_unary;
use crate::op::{BinaryOp, UnaryOp};
use half::{bf16, f16};
use std::mem::MaybeUninit;

/// A float type with slice kernels.
pub(crate) trait SimdFloat: FloatElem {
    /// `dst[i] = op(src[i])`; every `dst` element is written.
    fn unary_slice(op: UnaryOp, src: &[Self], dst: &mut [MaybeUninit<Self>]);
    /// `dst[i] = a[i] op b[i]`; every `dst` element is written.
    fn binary_slice(op: BinaryOp, a: &[Self], b: &[Self], dst: &mut [MaybeUninit<Self>]);
    /// `a[i] = a[i] op b[i]`, in place.
    fn binary_assign_slice(op: BinaryOp, a: &mut [Self], b: &[Self]);
}

impl SimdFloat for f32 {
    fn unary_slice(op: UnaryOp, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        if kernels::has_unary_f32(&op) {
            kernels::unary_f32(op, src, dst)
        } else {
            for (d, &x) in dst.iter_mut().zip(src) {
                d.write(scalar_unary(x, op));
            }
        }
    }
    fn binary_slice(op: BinaryOp, a: &[f32], b: &[f32], dst: &mut [MaybeUninit<f32>]) {
        kernels::binary(op, a, b, dst)
    }
    fn binary_assign_slice(op: BinaryOp, a: &mut [f32], b: &[f32]) {
        kernels::binary_in_place(op, a, b)
    }
}

impl SimdFloat for f64 {
    fn unary_slice(op: UnaryOp, src: &[f64], dst: &mut [MaybeUninit<f64>]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(scalar_unary(x, op));
        }
    }
    fn binary_slice(op: BinaryOp, a: &[f64], b: &[f64], dst: &mut [MaybeUninit<f64>]) {
        kernels::binary(op, a, b, dst)
    }
    fn binary_assign_slice(op: BinaryOp, a: &mut [f64], b: &[f64]) {
        kernels::binary_in_place(op, a, b)
    }
}

/// Views an initialised f32 buffer as a kernel's output.
fn as_out(s: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and the kernels write only
    // initialised values, so the buffer stays initialised for the reads that follow.
    unsafe { &mut *(s as *mut [f32] as *mut [MaybeUninit<f32>]) }
}

/// Reads an f32 buffer that a conversion kernel fully wrote.
fn read_back(s: &[MaybeUninit<f32>]) -> &[f32] {
    // SAFETY: only called on the prefix a `*_to_f32` kernel has just written in full.
    unsafe { &*(s as *const [MaybeUninit<f32>] as *const [f32]) }
}

macro_rules! staged_16bit {
    ($ty:ty, $to_f32:path, $from_f32:path) => {
        impl SimdFloat for $ty {
            fn unary_slice(op: UnaryOp, src: &[$ty], dst: &mut [MaybeUninit<$ty>]) {
                let mut x = [MaybeUninit::<f32>::uninit(); STAGE];
                let mut y = [0f32; STAGE];
                for (s, d) in src.chunks(STAGE).zip(dst.chunks_mut(STAGE)) {
                    let m = s.len();
                    $to_f32(s, &mut x[..m]);
                    f32::unary_slice(op, read_back(&x[..m]), as_out(&mut y[..m]));
                    $from_f32(&y[..m], d);
                }
            }
            fn binary_slice(op: BinaryOp, a: &[$ty], b: &[$ty], dst: &mut [MaybeUninit<$ty>]) {
                let mut x = [MaybeUninit::<f32>::uninit(); STAGE];
                let mut z = [MaybeUninit::<f32>::uninit(); STAGE];
                let mut y = [0f32; STAGE];
                for ((sa, sb), d) in a
                    .chunks(STAGE)
                    .zip(b.chunks(STAGE))
                    .zip(dst.chunks_mut(STAGE))
                {
                    let m = sa.len();
                    $to_f32(sa, &mut x[..m]);
                    $to_f32(sb, &mut z[..m]);
                    kernels::binary(
                        op,
                        read_back(&x[..m]),
                        read_back(&z[..m]),
                        as_out(&mut y[..m]),
                    );
                    $from_f32(&y[..m], d);
                }
            }
            fn binary_assign_slice(op: BinaryOp, a: &mut [$ty], b: &[$ty]) {
                let mut x = [MaybeUninit::<f32>::uninit(); STAGE];
                let mut z = [MaybeUninit::<f32>::uninit(); STAGE];
                let mut y = [0f32; STAGE];
                for (sa, sb) in a.chunks_mut(STAGE).zip(b.chunks(STAGE)) {
                    let m = sa.len();
                    $to_f32(sa, &mut x[..m]);
                    $to_f32(sb, &mut z[..m]);
                    kernels::binary(
                        op,
                        read_back(&x[..m]),
                        read_back(&z[..m]),
                        as_out(&mut y[..m]),
                    );
                    // SAFETY: `MaybeUninit<T>` has the layout of `T`; the chunk was read
                    // above, and the conversion writes every element with a value.
                    let d = unsafe { &mut *(sa as *mut [$ty] as *mut [MaybeUninit<$ty>]) };
                    $from_f32(&y[..m], d);
                }
            }
        }
    };
}
staged_16bit!(bf16, kernels::bf16_to_f32, kernels::f32_to_bf16);
staged_16bit!(f16, kernels::f16_to_f32, kernels::f32_to_f16);
