//! Host <-> device copies. Small copies go straight from or to pageable memory; large ones
//! go through two pinned staging buffers, so that copying one chunk into pinned memory
//! overlaps the DMA of the previous one.

use super::cuda_trace;
use super::device::CudaDevice;
use super::CudaStorage;
use crate::backend::cpu::{match_storage, CpuStorage};
use crate::backend::BackendStorage;
use crate::{DType, Error, Result, WithDType};
use cudarc::driver::{result, sys};
use std::mem::{size_of, MaybeUninit};
use std::sync::{Arc, MutexGuard};

/// Copies at or below this size skip the staging buffers.
const DIRECT_MAX: usize = 1 << 20;
/// Size of each staging buffer.
const CHUNK: usize = 8 << 20;

/// Two pinned host buffers and the events that mark their last DMA finished; one set per
/// device, made on the first large copy.
pub(crate) struct Staging {
    bufs: [*mut u8; 2],
    events: [sys::CUevent; 2],
}

// SAFETY: the raw buffers are only touched under the device's `staging` mutex.
unsafe impl Send for Staging {}

fn staging(dev: &CudaDevice) -> Result<MutexGuard<'_, Option<Staging>>> {
    let mut guard = dev.staging.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        dev.bind()?;
        let err =
            |e: cudarc::driver::DriverError| Error::Cuda(format!("pinned staging buffers: {e:?}"));
        let mut bufs = [std::ptr::null_mut(); 2];
        let mut events = [std::ptr::null_mut(); 2];
        for i in 0..2 {
            // SAFETY: a plain pinned allocation kept for the process lifetime.
            bufs[i] = unsafe { result::malloc_host(CHUNK, 0) }.map_err(err)? as *mut u8;
            events[i] =
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(err)?;
        }
        *guard = Some(Staging { bufs, events });
    }
    Ok(guard)
}

/// Copies `src` into `dst` with the host's threads (one memcpy is far below the DMA rate).
/// `dst` may be uninitialised.
fn parallel_copy(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 20;
    // SAFETY: u8 and MaybeUninit<u8> have the same layout, and reading initialised bytes as
    // MaybeUninit is always sound.
    let src: &[MaybeUninit<u8>] =
        unsafe { std::slice::from_raw_parts(src.as_ptr().cast(), src.len()) };
    dst.par_chunks_mut(PIECE)
        .zip(src.par_chunks(PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

pub(super) fn upload(dev: &Arc<CudaDevice>, cpu: &CpuStorage) -> Result<CudaStorage> {
    dev.refuse_in_capture(
        "host-to-device copy",
        "host memory cannot be read by a replay; copy new inputs into tensors made before \
         the capture (Tensor::assign) between replays",
    )?;
    crate::backend::check_not_capturing_elsewhere(dev.device(), "host-to-device copy")?;
    let out = CudaStorage::alloc(dev, cpu.len(), cpu.dtype())?;
    let bytes: &[u8] = match_storage!(cpu, v => bytemuck::cast_slice(v));
    if bytes.is_empty() {
        return Ok(out);
    }
    dev.bind()?;
    let stream = dev.stream.cu_stream();
    let err = |e: cudarc::driver::DriverError| Error::Cuda(format!("host-to-device copy: {e:?}"));
    if bytes.len() <= DIRECT_MAX {
        // SAFETY: `out` holds `bytes.len()` bytes; from pageable memory the call returns
        // once the source has been read, so `cpu` may be dropped afterwards.
        unsafe { result::memcpy_htod_async(out.buf.ptr, bytes, stream) }.map_err(err)?;
        return Ok(out);
    }
    let guard = staging(dev)?;
    let staging = guard.as_ref().expect("made by staging()");
    for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
        let slot = i % 2;
        // SAFETY: waits until the DMA that last read this buffer has finished, then fills
        // at most CHUNK bytes of it and queues its copy to `out` at the chunk's offset.
        unsafe {
            sys::cuEventSynchronize(staging.events[slot])
                .result()
                .map_err(err)?;
            let pinned = std::slice::from_raw_parts_mut(
                staging.bufs[slot].cast::<MaybeUninit<u8>>(),
                chunk.len(),
            );
            parallel_copy(pinned, chunk);
            let filled = std::slice::from_raw_parts(staging.bufs[slot], chunk.len());
            result::memcpy_htod_async(out.buf.ptr + (i * CHUNK) as u64, filled, stream)
                .map_err(err)?;
            result::event::record(staging.events[slot], stream).map_err(err)?;
        }
    }
    Ok(out)
}

/// `len` elements from `offset` of `x`, to the host. Waits for the queued work.
pub(super) fn download(x: &CudaStorage, offset: usize, len: usize) -> Result<CpuStorage> {
    fn typed<T: WithDType>(x: &CudaStorage, offset: usize, len: usize) -> Result<CpuStorage> {
        // Written straight into the vector's spare capacity: no zero-fill pass.
        let mut v: Vec<T> = Vec::with_capacity(len);
        // SAFETY: the spare capacity holds len * size_of::<T>() bytes, seen as MaybeUninit.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                v.as_mut_ptr().cast::<MaybeUninit<u8>>(),
                len * size_of::<T>(),
            )
        };
        copy_to_host(x, x.ptr_at(offset), dst)?;
        // SAFETY: copy_to_host wrote every byte, and T is Pod: any bytes are a valid T.
        unsafe { v.set_len(len) };
        Ok(CpuStorage::from_vec(v))
    }
    match x.dtype {
        DType::F16 => typed::<half::f16>(x, offset, len),
        DType::BF16 => typed::<half::bf16>(x, offset, len),
        DType::F32 => typed::<f32>(x, offset, len),
        DType::F64 => typed::<f64>(x, offset, len),
        DType::U8 => typed::<u8>(x, offset, len),
        DType::U32 => typed::<u32>(x, offset, len),
        DType::I64 => typed::<i64>(x, offset, len),
    }
}

fn copy_to_host(x: &CudaStorage, src: u64, dst: &mut [MaybeUninit<u8>]) -> Result<()> {
    let dev = x.dev();
    dev.refuse_in_capture(
        "device-to-host copy",
        "reading a value waits for the device; read outputs after a replay",
    )?;
    crate::backend::check_not_capturing_elsewhere(dev.device(), "device-to-host copy")?;
    dev.bind()?;
    let stream = dev.stream.cu_stream();
    let err = |e: cudarc::driver::DriverError| Error::Cuda(format!("device-to-host copy: {e:?}"));
    if dst.is_empty() {
        return Ok(());
    }
    cuda_trace!(
        "device-to-host copy of {} bytes on {}",
        dst.len(),
        dev.device()
    );
    if dst.len() <= DIRECT_MAX {
        // SAFETY: `src` addresses `dst.len()` bytes of `x`; the stream is synchronised before
        // `dst` is read.
        unsafe { result::memcpy_dtoh_async(dst, src, stream) }.map_err(err)?;
        return dev.stream.synchronize().map_err(err);
    }
    let guard = staging(dev)?;
    let staging = guard.as_ref().expect("made by staging()");
    let total = dst.len();
    let n = total.div_ceil(CHUNK);
    let issue = |i: usize| -> Result<()> {
        let len = CHUNK.min(total - i * CHUNK);
        let slot = i % 2;
        // SAFETY: the staging buffer holds CHUNK >= len bytes and nothing else uses it until
        // its event completes; `src + i*CHUNK` addresses `len` bytes of `x`.
        unsafe {
            let pinned =
                std::slice::from_raw_parts_mut(staging.bufs[slot].cast::<MaybeUninit<u8>>(), len);
            result::memcpy_dtoh_async(pinned, src + (i * CHUNK) as u64, stream).map_err(err)?;
            result::event::record(staging.events[slot], stream).map_err(err)
        }
    };
    issue(0)?;
    for i in 0..n {
        if i + 1 < n {
            issue(i + 1)?;
        }
        let len = CHUNK.min(total - i * CHUNK);
        // SAFETY: the event marks this chunk's DMA into the staging buffer as complete.
        unsafe {
            sys::cuEventSynchronize(staging.events[i % 2])
                .result()
                .map_err(err)?;
            let pinned = std::slice::from_raw_parts(staging.bufs[i % 2], len);
            parallel_copy(&mut dst[i * CHUNK..i * CHUNK + len], pinned);
        }
    }
    Ok(())
}
