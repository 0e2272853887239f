//! One wgpu device: its adapter, queue, limits, pipeline cache, caching allocator and the
//! batch of dispatches not yet submitted.
//!
//! Invariants:
//! - Everything that touches a pooled buffer (dispatches, uploads) is recorded into the
//!   [`Batch`] in program order and submitted in that order on the device's one queue; wgpu
//!   puts a barrier between two steps that touch one buffer. A buffer can therefore go back
//!   to the pool as soon as its tensor is dropped, even while recorded work still reads it
//!   (as on a CUDA stream): whatever reuses it is recorded, and runs, later.
//! - `queue.write_buffer` (which runs before the next submission's recorded work) only
//!   writes the device's own parameter buffer, which no pooled tensor uses and which the
//!   previous submission has finished reading by the time the write runs.

use super::alloc::Pool;
use crate::backend::memory::MemoryStats;
use crate::{Device, Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Dispatches recorded before a batch is submitted without waiting for a read.
const MAX_BATCH: usize = 512;
/// The largest staging buffer of an upload (see [`WgpuDevice::upload`]); a multiple of 4.
const UPLOAD_PIECE: usize = 8 << 20;
/// Staged upload bytes at which the batch is submitted.
const UPLOAD_PENDING: u64 = 64 << 20;

/// What `kiln info` shows of a wgpu adapter.
#[derive(Clone, Debug)]
pub struct AdapterInfo {
    /// The device ordinal: `Device::Wgpu(ordinal)`.
    pub ordinal: usize,
    pub name: String,
    /// Vulkan, Metal or Dx12.
    pub backend: String,
    /// DiscreteGpu, IntegratedGpu, Cpu, ...
    pub device_type: String,
    pub driver: String,
    /// Whether f16 tensors work on it (`SHADER_F16`).
    pub f16: bool,
    /// The largest buffer one shader binding can address, in bytes.
    pub max_binding_bytes: u64,
}

struct Registry {
    _instance: wgpu::Instance,
    adapters: Vec<wgpu::Adapter>,
    devices: Mutex<HashMap<usize, Arc<WgpuDevice>>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let mut adapters: Vec<wgpu::Adapter> =
            pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        };
        adapters.sort_by_key(rank);
        Registry {
            _instance: instance,
            adapters,
            devices: Mutex::new(HashMap::new()),
        }
    })
}

/// The adapters wgpu finds on this machine, in ordinal order (real GPUs first).
pub fn adapters() -> Vec<AdapterInfo> {
    registry()
        .adapters
        .iter()
        .enumerate()
        .map(|(ordinal, a)| {
            let info = a.get_info();
            AdapterInfo {
                ordinal,
                name: info.name,
                backend: format!("{:?}", info.backend),
                device_type: format!("{:?}", info.device_type),
                driver: format!("{} {}", info.driver, info.driver_info),
                f16: a.features().contains(wgpu::Features::SHADER_F16),
                max_binding_bytes: a.limits().max_storage_buffer_binding_size,
            }
        })
        .collect()
}

/// A compiled kernel and the key it is cached under (which names it in errors).
pub(crate) struct Pipeline {
    pub key: String,
    pub inner: wgpu::ComputePipeline,
}

/// A buffer bound to a dispatch: whole, or the byte range `(offset, size)`.
pub(crate) type Bound = (Arc<super::WgpuBuffer>, Option<(u64, u64)>);

/// A recorded step: a compute dispatch, or a copy of host data into a buffer.
enum Step {
    Dispatch {
        pipeline: Arc<Pipeline>,
        /// Handles (not pool entries: the pool may hand the buffer out again).
        buffers: Vec<(wgpu::Buffer, Option<(u64, u64)>)>,
        /// Byte range of this dispatch's parameters in the parameter buffer.
        params: (u64, u64),
        groups: [u32; 3],
    },
    Upload {
        staging: wgpu::Buffer,
        dst: wgpu::Buffer,
        /// Byte offset in `dst`.
        at: u64,
        bytes: u64,
    },
    /// A GPU timestamp into query `index` of `queries`, in order with the other steps.
    Timestamp { queries: wgpu::QuerySet, index: u32 },
}

/// Steps recorded since the last submission and their dispatches' parameters, packed into
/// the parameter buffer at submission.
#[derive(Default)]
struct Batch {
    steps: Vec<Step>,
    dispatches: usize,
    params: Vec<u8>,
    /// The parameter buffer (grown as needed) and its size.
    param_buffer: Option<wgpu::Buffer>,
    /// Bytes in the staging buffers of the recorded uploads.
    staged_bytes: u64,
}

/// One wgpu device (an adapter opened with its full limits).
pub(crate) struct WgpuDevice {
    pub ordinal: usize,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub f16: bool,
    pipelines: Mutex<HashMap<String, Arc<Pipeline>>>,
    batch: Mutex<Batch>,
    pub(super) pool: Mutex<Pool>,
    /// The first error wgpu reported outside an error scope, returned by the next read.
    uncaptured: Arc<Mutex<Option<String>>>,
    /// A word shaders set when they meet a bad value (a label out of range), read and
    /// cleared at every read back to the host.
    pub(super) fault: OnceLock<Arc<super::WgpuBuffer>>,
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuDevice({}: {})", self.ordinal, self.info.name)
    }
}

impl WgpuDevice {
    /// The device with this ordinal, opened on first use.
    pub fn get(ordinal: usize) -> Result<Arc<WgpuDevice>> {
        let reg = registry();
        let mut devices = reg.devices.lock();
        if let Some(d) = devices.get(&ordinal) {
            return Ok(d.clone());
        }
        let unavailable = |reason: String| Error::DeviceUnavailable {
            device: Device::Wgpu(ordinal),
            reason,
        };
        let adapter = reg.adapters.get(ordinal).ok_or_else(|| {
            unavailable(if reg.adapters.is_empty() {
                "wgpu found no adapter (is a Vulkan loader and driver installed? On Debian: \
                 apt-get install libvulkan1 mesa-vulkan-drivers)"
                    .into()
            } else {
                format!("wgpu found {} adapter(s)", reg.adapters.len())
            })
        })?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let timing =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let features = adapter.features() & (wgpu::Features::SHADER_F16 | timing);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| unavailable(format!("{}: {e}", info.name)))?;
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().get_or_insert_with(|| e.to_string());
        }));
        let dev = Arc::new(WgpuDevice {
            ordinal,
            device,
            queue,
            info,
            limits,
            f16,
            pipelines: Mutex::new(HashMap::new()),
            batch: Mutex::new(Batch::default()),
            pool: Mutex::new(Pool::default()),
            uncaptured,
            fault: OnceLock::new(),
        });
        devices.insert(ordinal, dev.clone());
        Ok(dev)
    }

    pub fn kiln_device(&self) -> Device {
        Device::Wgpu(self.ordinal)
    }

    /// The compute pipeline `key` names, built from `source()` (WGSL, entry point `main`) on
    /// first use.
    pub fn pipeline(&self, key: &str, source: impl FnOnce() -> String) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.pipelines.lock().get(key) {
            return Ok(p.clone());
        }
        let source = source();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            if std::env::var_os("KILN_WGPU_DUMP").is_some() {
                eprintln!("{source}");
            }
            return Err(self.error(format!(
                "shader {key} did not compile (KILN_WGPU_DUMP=1 prints its source): {e}"
            )));
        }
        let pipeline = Arc::new(Pipeline {
            key: key.to_string(),
            inner: pipeline,
        });
        self.pipelines
            .lock()
            .insert(key.to_string(), pipeline.clone());
        Ok(pipeline)
    }

    /// Records a dispatch of `pipeline` over `groups` workgroups with `params` (bytes, bound
    /// at binding 0) and `buffers` at bindings 1, 2, ...
    pub fn dispatch(
        self: &Arc<Self>,
        pipeline: Arc<Pipeline>,
        params: &[u8],
        buffers: Vec<Arc<super::WgpuBuffer>>,
        groups: [u32; 3],
    ) -> Result<()> {
        let whole = buffers.into_iter().map(|b| (b, None)).collect();
        self.dispatch_ranges(pipeline, params, whole, groups)
    }

    /// [`WgpuDevice::dispatch`] with buffers bound whole or by byte range. A binding above
    /// the adapter's limit is an error naming the kernel.
    pub fn dispatch_ranges(
        self: &Arc<Self>,
        pipeline: Arc<Pipeline>,
        params: &[u8],
        buffers: Vec<Bound>,
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let limit = self.limits.max_storage_buffer_binding_size;
        for (b, range) in &buffers {
            let size = range.map_or(b.buffer.size(), |r| r.1);
            if size > limit {
                return Err(self.error(format!(
                    "{}: an operand of {size} bytes is larger than this adapter's largest storage binding ({limit} bytes); only index_select reads tensors that large (take rows of it first)",
                    pipeline.key
                )));
            }
        }
        let full = {
            let mut b = self.batch.lock();
            let align = self.limits.min_storage_buffer_offset_alignment.max(16) as usize;
            let start = b.params.len().next_multiple_of(align);
            b.params.resize(start, 0);
            b.params.extend_from_slice(params);
            // A binding must not be empty.
            let len = params.len().max(4).next_multiple_of(4);
            b.params.resize(start + len, 0);
            b.steps.push(Step::Dispatch {
                pipeline,
                buffers: buffers
                    .into_iter()
                    .map(|(buf, range)| (buf.buffer.clone(), range))
                    .collect(),
                params: (start as u64, len as u64),
                groups,
            });
            b.dispatches += 1;
            b.dispatches >= MAX_BATCH
        };
        if full {
            self.flush()?;
        }
        Ok(())
    }

    /// Workgroup counts for `groups` workgroups of a 1-D launch, folded into 2-D beyond the
    /// per-dimension limit (shaders recover the index from `num_workgroups`).
    pub fn grid(&self, groups: u64) -> Result<[u32; 3]> {
        let max = u64::from(self.limits.max_compute_workgroups_per_dimension.max(1));
        // As few rows as fit, each as short as covers `groups`: fewer than `y` idle
        // workgroups (rows of `max` left up to 65 534 idle ones in the last row).
        let y = groups.div_ceil(max);
        let x = groups.div_ceil(y.max(1)).min(max);
        if y > max {
            return Err(Error::Msg(format!(
                "wgpu:{}: {groups} workgroups exceed this adapter's grid ({max}²)",
                self.ordinal
            )));
        }
        Ok([x as u32, y.max(1) as u32, 1])
    }

    /// Submits the recorded dispatches (and `then`, work to append after them) to the queue.
    pub fn flush_with(
        self: &Arc<Self>,
        then: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<wgpu::SubmissionIndex> {
        // The lock is held until the submission: work recorded after this batch (by any
        // thread) is submitted after it.
        let mut pending = self.batch.lock();
        let param_buffer = pending.param_buffer.take();
        let batch = std::mem::take(&mut *pending);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln"),
            });
        let params = if batch.params.is_empty() {
            param_buffer
        } else {
            let need = (batch.params.len() as u64).next_multiple_of(4);
            let buf = match param_buffer {
                Some(b) if b.size() >= need => b,
                _ => self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kiln parameters"),
                    size: need.next_power_of_two().max(1 << 16),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
            };
            self.queue.write_buffer(&buf, 0, &batch.params);
            Some(buf)
        };
        let mut steps = batch.steps.iter().peekable();
        while let Some(step) = steps.next() {
            match step {
                Step::Upload {
                    staging,
                    dst,
                    at,
                    bytes,
                } => encoder.copy_buffer_to_buffer(staging, 0, dst, *at, *bytes),
                Step::Timestamp { queries, index } => encoder.write_timestamp(queries, *index),
                Step::Dispatch { .. } => {
                    let params = params.as_ref().expect("dispatches have parameters");
                    let mut pass =
                        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    let mut next = Some(step);
                    while let Some(Step::Dispatch {
                        pipeline,
                        buffers,
                        params: range,
                        groups,
                    }) = next
                    {
                        let group = self.bind_group(pipeline, params, *range, buffers);
                        pass.set_pipeline(&pipeline.inner);
                        pass.set_bind_group(0, &group, &[]);
                        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                        next = steps.next_if(|s| matches!(s, Step::Dispatch { .. }));
                    }
                }
            }
        }
        then(&mut encoder);
        let index = self.queue.submit([encoder.finish()]);
        pending.param_buffer = params;
        drop(pending);
        LAUNCHES.fetch_add(
            batch.dispatches as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(index)
    }

    fn bind_group(
        &self,
        pipeline: &Pipeline,
        params: &wgpu::Buffer,
        range: (u64, u64),
        buffers: &[(wgpu::Buffer, Option<(u64, u64)>)],
    ) -> wgpu::BindGroup {
        let bound = |buffer, range: Option<(u64, u64)>| match range {
            None => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: None,
            }),
            Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset,
                size: std::num::NonZeroU64::new(size),
            }),
        };
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: bound(params, Some(range)),
        }];
        for (i, (b, r)) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: bound(b, *r),
            });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.inner.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// Records a copy of `bytes` (padded to whole words) into the start of `dst`, in order
    /// with the recorded dispatches.
    ///
    /// The data goes through staging buffers of at most [`UPLOAD_PIECE`] bytes, and the batch
    /// is submitted whenever [`UPLOAD_PENDING`] bytes wait in them, which bounds the
    /// mappable memory an upload holds (a whole-tensor staging buffer held as much as the
    /// tensor; on NVIDIA's driver that is device memory the host can map). Kernel speed
    /// was the same either way on the H100 (bench/results/2026-11-26j).
    pub fn upload(self: &Arc<Self>, dst: &super::WgpuBuffer, bytes: &[u8]) -> Result<()> {
        let mut at = 0usize;
        while at < bytes.len() {
            let piece = &bytes[at..bytes.len().min(at + UPLOAD_PIECE)];
            let size = (piece.len() as u64).next_multiple_of(4);
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln upload"),
                size,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            });
            {
                let mut view = staging
                    .slice(..)
                    .get_mapped_range_mut()
                    .map_err(|e| self.error(format!("mapping an upload buffer: {e}")))?;
                view.slice(..piece.len()).copy_from_slice(piece);
            }
            staging.unmap();
            let full = {
                let mut b = self.batch.lock();
                b.steps.push(Step::Upload {
                    staging,
                    dst: dst.buffer.clone(),
                    at: at as u64,
                    bytes: size,
                });
                b.staged_bytes += size;
                b.steps.len() >= MAX_BATCH || b.staged_bytes >= UPLOAD_PENDING
            };
            if full {
                self.flush()?;
            }
            at += piece.len();
        }
        Ok(())
    }

    /// Submits the recorded dispatches.
    pub fn flush(self: &Arc<Self>) -> Result<()> {
        self.flush_with(|_| {}).map(|_| ())
    }

    /// Waits until the queue is idle, then reports any error wgpu met meanwhile.
    pub fn synchronize(self: &Arc<Self>) -> Result<()> {
        let index = self.flush_with(|_| {})?;
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| self.error(format!("waiting for the queue: {e}")))?;
        self.take_uncaptured()
    }

    fn take_uncaptured(&self) -> Result<()> {
        match self.uncaptured.lock().take() {
            Some(e) => Err(self.error(e)),
            None => Ok(()),
        }
    }

    pub fn error(&self, msg: impl std::fmt::Display) -> Error {
        Error::Msg(format!("wgpu:{} ({}): {msg}", self.ordinal, self.info.name))
    }

    /// Copies `bytes` bytes at `offset` of `src` (both multiples of 4) to the host, after
    /// all recorded work.
    pub fn read(
        self: &Arc<Self>,
        src: &super::WgpuBuffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        if bytes == 0 {
            self.synchronize()?;
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln read"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let fault = self.fault.get().cloned();
        let fault_staging = fault.as_ref().map(|_| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln fault read"),
                size: 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        let index = self.flush_with(|enc| {
            enc.copy_buffer_to_buffer(&src.buffer, offset, &staging, 0, bytes);
            if let (Some(f), Some(s)) = (&fault, &fault_staging) {
                enc.copy_buffer_to_buffer(&f.buffer, 0, s, 0, 4);
                enc.clear_buffer(&f.buffer, 0, None);
            }
        })?;
        let map = |b: &wgpu::Buffer| {
            let (tx, rx) = std::sync::mpsc::channel();
            b.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            rx
        };
        let rx = map(&staging);
        let frx = fault_staging.as_ref().map(map);
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| self.error(format!("waiting for a read: {e}")))?;
        self.take_uncaptured()?;
        let mapped = |rx: std::sync::mpsc::Receiver<_>| -> Result<()> {
            match rx.recv() {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(self.error(format!("mapping a read buffer: {e}"))),
                Err(_) => Err(self.error("a read buffer was never mapped")),
            }
        };
        mapped(rx)?;
        if let (Some(frx), Some(fs)) = (frx, &fault_staging) {
            mapped(frx)?;
            let word = {
                let view = fs
                    .get_mapped_range(..)
                    .map_err(|e| self.error(format!("reading the fault word: {e}")))?;
                u32::from_le_bytes([view[0], view[1], view[2], view[3]])
            };
            if word != 0 {
                return Err(super::fused::fault_error(self, word));
            }
        }
        let out = staging
            .get_mapped_range(..)
            .map_err(|e| self.error(format!("reading back: {e}")))?
            .to_vec();
        Ok(out)
    }

    /// Runs `f` and measures the GPU time between the work queued before it and the end
    /// of the work it queued, in milliseconds: timestamps written by the GPU where the
    /// adapter has them, else the wall clock around a synchronised region.
    ///
    /// Both timestamps go into the command buffer that holds `f`'s work (unless `f` fills
    /// a batch and submits), so the host's encoding and submission of that buffer is not
    /// counted: with the first timestamp in a submission of its own, the GPU idled from it
    /// until the host had built and submitted the next one, and a 64M-element add read as
    /// a third of the copy rate.
    pub fn time_region<T>(self: &Arc<Self>, f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
        let mut f = Some(f);
        let (mut outs, times) = self.time_runs(1, || f.take().expect("one run")())?;
        Ok((outs.pop().expect("one run"), times[0]))
    }

    /// Runs `f` `reps` times back to back and returns the GPU time of each run, in
    /// milliseconds, as [`WgpuDevice::time_region`] measures one: one timestamp before the
    /// first run and one after each, all read once at the end, so the host does not wait
    /// for a reading between runs.
    pub fn time_each(
        self: &Arc<Self>,
        reps: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        self.time_runs(reps, &mut f).map(|(_, times)| times)
    }

    /// `reps` runs of `f` (at most wgpu's queries per set less one), their results and
    /// their GPU times in milliseconds.
    fn time_runs<T>(
        self: &Arc<Self>,
        reps: usize,
        mut f: impl FnMut() -> Result<T>,
    ) -> Result<(Vec<T>, Vec<f64>)> {
        let reps = reps.clamp(1, wgpu::QUERY_SET_MAX_QUERIES as usize - 1);
        let mut outs = Vec::with_capacity(reps);
        let timing =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        if !self.device.features().contains(timing) {
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                self.synchronize()?;
                let t = std::time::Instant::now();
                outs.push(f()?);
                self.synchronize()?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            return Ok((outs, times));
        }
        let count = reps as u32 + 1;
        let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kiln timing"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln timing"),
            size: 8 * u64::from(count),
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let stamp = |index: u32| {
            self.batch.lock().steps.push(Step::Timestamp {
                queries: queries.clone(),
                index,
            })
        };
        stamp(0);
        for i in 1..count {
            outs.push(f()?);
            stamp(i);
        }
        self.flush_with(|enc| enc.resolve_query_set(&queries, 0..count, &resolved, 0))?;
        let holder = super::WgpuBuffer::wrap_foreign(self, resolved);
        let raw = self.read(&holder, 0, 8 * u64::from(count))?;
        let ticks =
            |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let period = f64::from(self.queue.get_timestamp_period());
        let times = (1..count as usize)
            .map(|i| ticks(i).saturating_sub(ticks(i - 1)) as f64 * period * 1e-6)
            .collect();
        Ok((outs, times))
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.pool.lock().stats
    }
}

static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Compute dispatches submitted by kiln on every wgpu device so far.
pub fn dispatch_count() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}
