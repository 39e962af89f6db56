//! Adapter selection, device creation, error capture and readback.

use std::sync::{Arc, Mutex};

use crate::gpu::Encoder;
use crate::gpu::memory::MemoryLedger;
use crate::gpu::pipeline::PipelineCache;
use crate::gpu::pool::BufferPool;
use crate::gpu::profile::Profile;
use crate::tuning::{self, DeviceClass};
use crate::{Error, Result};

/// How to pick and open a GPU.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Pick the first adapter whose name contains this text (case-insensitive).
    /// [`GpuOptions::from_env`] fills it from `FLINT_ADAPTER`.
    pub adapter_name: Option<String>,
    /// Do not request optional features (subgroups, shader-f16, timestamps) even where the
    /// adapter has them: exercises the portable paths.
    pub portable_only: bool,
    /// Bytes of GPU memory that flint's weights, KV cache and activations may hold at most
    /// (none: as much as the device gives). A buffer that would go past it is refused with
    /// [`Error::OutOfMemory`] before anything is allocated: at load, the load fails; in an
    /// engine step, the requests of that step fail and the engine goes on.
    pub memory_budget: Option<u64>,
    /// Where weight matrices live. [`GpuOptions::from_env`] reads `FLINT_WEIGHTS` (`buffers`,
    /// `textures` or `auto`).
    pub weight_storage: WeightStorage,
}

/// Where a device keeps weight matrices: what its kernels read fastest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum WeightStorage {
    /// Textures on a native CPU adapter (lavapipe, SwiftShader), storage buffers elsewhere
    /// (and with [`GpuOptions::portable_only`]).
    #[default]
    Auto,
    /// Read-only storage buffers of `vec4<u32>`: what every device can read, and what GPUs
    /// read fastest.
    Buffers,
    /// Read-only `rgba32uint` storage textures. On Mesa's llvmpipe every storage-buffer load is
    /// a loop over the SIMD lanes with a bounds check per 32-bit word; a texel load is not, so
    /// products read weights 2-3x faster (measured on lavapipe 22.3).
    Textures,
}

impl GpuOptions {
    /// Options from the environment: `FLINT_ADAPTER` selects an adapter by name and
    /// `FLINT_PORTABLE=1` turns off the optional features.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let weight_storage = match var("FLINT_WEIGHTS").as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("buffers") => WeightStorage::Buffers,
            Some("textures") => WeightStorage::Textures,
            _ => WeightStorage::Auto,
        };
        GpuOptions {
            adapter_name: var("FLINT_ADAPTER"),
            portable_only: var("FLINT_PORTABLE").is_some_and(|v| v != "0"),
            memory_budget: None,
            weight_storage,
        }
    }
}

/// Optional features the device was opened with. Every kernel has a path that needs none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GpuFeatures {
    /// `subgroupAdd` and friends are available.
    pub subgroups: bool,
    /// The `f16` type is available in shaders.
    pub shader_f16: bool,
    /// Timestamp queries can be written at pass boundaries.
    pub timestamps: bool,
    /// Weight matrices live in textures ([`WeightStorage::Textures`]), not storage buffers.
    pub weight_textures: bool,
}

/// What a device is and what it can do, for `flint gpu`, logs and bug reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceDescription {
    /// Adapter name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)".
    pub adapter: String,
    /// Backend: Vulkan, Metal, Dx12 or BrowserWebGpu.
    pub backend: String,
    /// Discrete, integrated, virtual, CPU or other.
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// The optional features the device was opened with.
    pub features: GpuFeatures,
    /// Largest storage binding, in bytes.
    pub max_storage_binding_bytes: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_bytes: u64,
    /// Workgroup memory, in bytes.
    pub max_workgroup_storage_bytes: u32,
    /// Invocations per workgroup.
    pub max_invocations_per_workgroup: u32,
    /// Workgroups per dispatch dimension.
    pub max_workgroups_per_dimension: u32,
}

/// Counts of GPU objects created on a device ([`GpuContext::created`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CreatedObjects {
    /// Buffers: tensors, parameter blocks and readback buffers (pooled), weights, constants.
    pub buffers: u64,
    /// Bind groups: one per dispatch today.
    pub bind_groups: u64,
    /// Compute pipelines: one per kernel variant, on its first use.
    pub pipelines: u64,
}

/// Bytes a load writes through staging memory before it flushes the queue
/// ([`GpuContext::staged_upload`]).
pub(crate) const UPLOAD_STAGING_BYTES: u64 = 64 << 20;

/// One opened GPU device, shared (behind `Arc`) by everything that records work on it.
pub struct GpuContext {
    device: wgpu::Device,
    queue: wgpu::Queue,
    adapter_info: wgpu::AdapterInfo,
    /// What the kernels' tuning reads of the device, taken from the adapter once.
    device_class: DeviceClass,
    features: GpuFeatures,
    limits: wgpu::Limits,
    pub(crate) pipelines: PipelineCache,
    /// The first error wgpu reported since the last [`GpuContext::check_errors`]: wgpu reports
    /// validation errors through a callback, and we return them as values at the next sync point.
    captured_error: Arc<Mutex<Option<String>>>,
    /// Dispatches recorded since the device was opened: dispatch count per step matters as
    /// much as bytes (about 30 µs each on lavapipe), and `flint bench` reports it.
    pub(crate) dispatches: std::sync::atomic::AtomicU64,
    /// Of those, the dispatches recorded inside transformer layers ([`GpuContext::count_layer_dispatches`]).
    layer_dispatches: std::sync::atomic::AtomicU64,
    /// Buffers created outside the pool (weights, constants, profiles), bind groups and
    /// pipelines created since the device was opened ([`GpuContext::created`]).
    created_buffers: std::sync::atomic::AtomicU64,
    pub(crate) created_bind_groups: std::sync::atomic::AtomicU64,
    pub(crate) created_pipelines: std::sync::atomic::AtomicU64,
    /// The open profile, while kernels are being timed.
    pub(crate) profile: Mutex<Option<Profile>>,
    pub(crate) memory: Arc<MemoryLedger>,
    /// Released tensors', parameters' and readback buffers, for reuse.
    pub(crate) buffers: Arc<BufferPool>,
    /// The latest submission: a [`crate::gpu::Readback`] waits for the one that copies it.
    last_submission: Mutex<Option<wgpu::SubmissionIndex>>,
    /// The textures [`GpuContext::scratch_textures`] hands out, and the words each holds.
    scratch_textures: Mutex<Option<(usize, [ScratchTexture; 2])>>,
    /// Bytes uploaded through staging memory since the queue last flushed it, and that flush's
    /// submission ([`GpuContext::staged_upload`]).
    staged: Mutex<(u64, Option<wgpu::SubmissionIndex>)>,
}

/// A texture of [`GpuContext::scratch_textures`] and its view.
#[derive(Clone)]
pub(crate) struct ScratchTexture {
    pub(crate) texture: wgpu::Texture,
    pub(crate) view: wgpu::TextureView,
}

const NO_ADAPTER_HELP: &str = "no GPU adapter found. flint needs a GPU with Vulkan, Metal, DX12 or \
    WebGPU. On Linux without a GPU, install Mesa's software Vulkan driver lavapipe \
    (Debian/Ubuntu: `apt-get install mesa-vulkan-drivers`)";

impl GpuContext {
    /// Opens the best adapter: the one named by `options.adapter_name` if given, else a discrete
    /// GPU, else an integrated one, else any (such as lavapipe). Requests the adapter's own limits
    /// and the optional features it has.
    pub async fn new(options: &GpuOptions) -> Result<Arc<Self>> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pick_adapter(&instance, options).await?;
        let info = adapter.get_info();
        let available = adapter.features();
        let mut wanted = wgpu::Features::empty();
        if !options.portable_only {
            wanted |= wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY;
        }
        let required_features = available & wanted;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("flint"),
                required_features,
                // The defaults cap storage bindings at 128 MiB and buffers at 256 MiB: ask for all
                // the adapter has, since model weights are large.
                required_limits: adapter.limits(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::DeviceRequest { adapter: info.name.clone(), reason: e.to_string() })?;
        let captured_error = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&captured_error);
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| error.to_string());
            }
        }));
        let limits = device.limits();
        let memory = Arc::new(MemoryLedger::new(options.memory_budget));
        let device_class = DeviceClass::of(&info);
        // wgpu's WebGPU types are neither Send nor Sync on wasm32, where there is one thread.
        #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
        let ctx = Arc::new(GpuContext {
            features: GpuFeatures {
                subgroups: required_features.contains(wgpu::Features::SUBGROUP),
                shader_f16: required_features.contains(wgpu::Features::SHADER_F16),
                timestamps: required_features.contains(wgpu::Features::TIMESTAMP_QUERY),
                weight_textures: match options.weight_storage {
                    WeightStorage::Buffers => false,
                    WeightStorage::Textures => true,
                    WeightStorage::Auto => {
                        !options.portable_only
                            && !cfg!(target_arch = "wasm32")
                            && tuning::weights_in_textures(device_class)
                    }
                },
            },
            device,
            queue,
            adapter_info: info,
            device_class,
            limits,
            pipelines: PipelineCache::default(),
            dispatches: std::sync::atomic::AtomicU64::new(0),
            layer_dispatches: std::sync::atomic::AtomicU64::new(0),
            created_buffers: std::sync::atomic::AtomicU64::new(0),
            created_bind_groups: std::sync::atomic::AtomicU64::new(0),
            created_pipelines: std::sync::atomic::AtomicU64::new(0),
            profile: Mutex::new(None),
            memory: Arc::clone(&memory),
            buffers: Arc::new(BufferPool::new(memory)),
            last_submission: Mutex::new(None),
            captured_error,
            scratch_textures: Mutex::new(None),
            staged: Mutex::new((0, None)),
        });
        Ok(ctx)
    }

    /// Two word textures ([`crate::gpu::weight::words_texture`]) of at least `words` words each,
    /// the same two from call to call (replaced by larger ones as needed), for kernels that read
    /// a buffer faster through a texture (on lavapipe a storage load is a loop over the lanes,
    /// a texture load a gather). Every user records a copy into them before the dispatch that
    /// reads them, so sharing them is safe in command order. None where `words` needs more rows
    /// than the device's textures may have. Each comes with its view, the same from call to call
    /// too, so that the bind groups naming it are found again.
    pub(crate) fn scratch_textures(&self, words: usize) -> Option<[ScratchTexture; 2]> {
        if crate::gpu::weight::words_texture_rows(words) > self.limits.max_texture_dimension_2d {
            return None;
        }
        let mut scratch = self.scratch_textures.lock().unwrap_or_else(|e| e.into_inner());
        match &*scratch {
            Some((held, textures)) if *held >= words => Some(textures.clone()),
            held => {
                // At least twice what was held, where that fits: a KV cache filling up then
                // replaces them (and the bind groups naming them) a few times, not every block.
                let doubled = held.as_ref().map_or(0, |(held, _)| held * 2);
                let fits = |words| {
                    crate::gpu::weight::words_texture_rows(words) <= self.limits.max_texture_dimension_2d
                };
                let words = if fits(doubled) { words.max(doubled) } else { words };
                let make = |label| {
                    let texture = crate::gpu::weight::words_texture(self, label, words);
                    let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
                    ScratchTexture { texture, view }
                };
                let textures = [make("flint scratch texture 0"), make("flint scratch texture 1")];
                *scratch = Some((words, textures.clone()));
                Some(textures)
            }
        }
    }

    /// The wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The device's queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Name, backend, device type and driver of the adapter.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.adapter_info
    }

    /// The kind of device, which decides the kernels' tuning (`tuning.rs`).
    pub fn device_class(&self) -> DeviceClass {
        self.device_class
    }

    /// The optional features this device was opened with.
    pub fn features(&self) -> GpuFeatures {
        self.features
    }

    /// The device's real limits (the adapter's, not wgpu's defaults).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// What this device is and what it can do.
    pub fn describe(&self) -> DeviceDescription {
        let info = &self.adapter_info;
        DeviceDescription {
            adapter: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            features: self.features,
            max_storage_binding_bytes: self.limits.max_storage_buffer_binding_size,
            max_buffer_bytes: self.limits.max_buffer_size,
            max_workgroup_storage_bytes: self.limits.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: self.limits.max_compute_invocations_per_workgroup,
            max_workgroups_per_dimension: self.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// The largest byte size one storage binding may have on this device.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// Frees the buffers that released tensors left for reuse (the engine calls this when it
    /// runs out of work, so that an idle engine holds only its weights and KV cache).
    pub(crate) fn free_idle_buffers(&self) {
        self.buffers.free_idle();
    }

    /// Bytes of GPU memory held now by flint's weights, tensors, parameter and readback buffers,
    /// including released buffers kept for reuse (freed when idle for a while, past 64 MiB of
    /// them, when the budget needs their room, and when the engine runs out of work).
    pub fn memory_in_use(&self) -> u64 {
        self.memory.in_use()
    }

    /// The most bytes [`GpuContext::memory_in_use`] has been.
    pub fn memory_peak(&self) -> u64 {
        self.memory.peak()
    }

    /// The memory budget this context was opened with ([`GpuOptions::memory_budget`]).
    pub fn memory_budget(&self) -> Option<u64> {
        self.memory.budget()
    }

    /// Kernel dispatches recorded on this device so far.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Of [`GpuContext::dispatch_count`], those recorded inside a model's transformer layers
    /// (the rest: embedding, output head), so that dispatches per layer can be told apart from
    /// a step's fixed ones.
    pub fn layer_dispatch_count(&self) -> u64 {
        self.layer_dispatches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The GPU objects created on this device so far, by kind: after its first step of a shape, a
    /// step should create nothing but what it cannot reuse.
    pub fn created(&self) -> CreatedObjects {
        let load = |count: &std::sync::atomic::AtomicU64| count.load(std::sync::atomic::Ordering::Relaxed);
        CreatedObjects {
            buffers: self.buffers.created() + load(&self.created_buffers),
            bind_groups: load(&self.created_bind_groups),
            pipelines: load(&self.created_pipelines),
        }
    }

    /// Counts a buffer created outside the pool in [`GpuContext::created`].
    pub(crate) fn count_created_buffer(&self) {
        self.created_buffers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds `dispatches` recorded inside transformer layers to [`GpuContext::layer_dispatch_count`].
    pub(crate) fn count_layer_dispatches(&self, dispatches: u64) {
        self.layer_dispatches.fetch_add(dispatches, std::sync::atomic::Ordering::Relaxed);
    }

    /// Returns the first GPU error reported since the last call, if any.
    pub fn check_errors(&self) -> Result<()> {
        let error = self.captured_error.lock().ok().and_then(|mut slot| slot.take());
        match error {
            Some(message) => Err(Error::Gpu(message)),
            None => Ok(()),
        }
    }

    /// The latest submission, if any.
    pub(crate) fn last_submission(&self) -> Option<wgpu::SubmissionIndex> {
        self.last_submission.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts `bytes` just written through the queue (`write_buffer`, `write_texture`). wgpu
    /// copies them through host staging memory that it frees only once a submission has carried
    /// the copy out, and a load submits nothing else: every [`UPLOAD_STAGING_BYTES`] the queue is
    /// flushed, and (natively) the flush before it waited for, so that at most two windows of
    /// staging memory are held while the host goes on writing, instead of the model's size.
    pub(crate) fn staged_upload(&self, bytes: u64) {
        let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        staged.0 += bytes;
        if staged.0 < UPLOAD_STAGING_BYTES {
            return;
        }
        let previous = staged.1.replace(self.queue.submit([]));
        staged.0 = 0;
        drop(staged);
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(previous) = previous {
            let _ =
                self.device.poll(wgpu::PollType::Wait { submission_index: Some(previous), timeout: None });
        }
        #[cfg(target_arch = "wasm32")]
        let _ = previous;
    }

    /// A new command encoder.
    pub fn encoder(&self, label: &str) -> Encoder {
        Encoder::new(self, label)
    }

    /// Submits recorded work (its parameters written first), then reports any error wgpu raised
    /// while recording it.
    pub fn submit(&self, encoder: Encoder) -> Result<()> {
        let (commands, open) = encoder.finish(&self.queue);
        let submission = self.queue.submit([commands]);
        *self.last_submission.lock().unwrap_or_else(|e| e.into_inner()) = Some(submission);
        // Only now may buffers released while it was recorded be handed out again.
        drop(open);
        self.check_errors()
    }
}

async fn pick_adapter(instance: &wgpu::Instance, options: &GpuOptions) -> Result<wgpu::Adapter> {
    let adapters = instance.enumerate_adapters(wgpu::Backends::PRIMARY).await;
    if let Some(wanted) = &options.adapter_name {
        let wanted_lower = wanted.to_lowercase();
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        return adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&wanted_lower))
            .ok_or_else(|| {
                Error::NoAdapter(format!(
                    "no GPU adapter's name contains '{wanted}' (FLINT_ADAPTER); adapters found: {}",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ))
            });
    }
    // On the web enumerate_adapters returns nothing: ask for the browser's adapter instead.
    if adapters.is_empty() {
        return instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|_| Error::NoAdapter(NO_ADAPTER_HELP.into()));
    }
    let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    adapters.into_iter().min_by_key(rank).ok_or_else(|| Error::NoAdapter(NO_ADAPTER_HELP.into()))
}
