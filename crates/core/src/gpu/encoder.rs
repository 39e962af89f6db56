//! [`Encoder`]: a command encoder that records consecutive dispatches into one compute pass and
//! gathers their parameters into one buffer.
//!
//! A decode step is ~150 small dispatches. On an NVIDIA H200 a SmolLM2 step took 14 ms of which
//! the GPU ran 4.6: recorded one pass and one parameter buffer a dispatch, every buffer was a
//! driver allocation plus, written at creation, a staging buffer and a copy. Here parameters go
//! into blocks of one buffer, written once when the encoder is submitted, and dispatches share a
//! pass until something else (a copy) is recorded: decode went from 83 to 129 tok/s there.
//! Within a pass wgpu still puts a barrier between two dispatches where the second reads what
//! the first wrote: each dispatch is its own usage scope.

use std::num::NonZeroU64;
use std::sync::Arc;

use crate::Result;
use crate::gpu::GpuContext;
use crate::gpu::bind_groups::BindGroupCache;
use crate::gpu::pool::{OpenEncoder, PooledBuffer};

/// Bytes of one parameter block: room for a decode step's ~150 dispatches at a 256-byte
/// alignment.
const PARAMS_BLOCK_BYTES: u64 = 64 * 1024;

/// Records GPU work for one submission ([`GpuContext::encoder`], [`GpuContext::submit`]).
pub struct Encoder {
    raw: wgpu::CommandEncoder,
    /// The pass consecutive dispatches share; closed before any other command is recorded.
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<ParamsBlock>,
    /// Offsets of parameters are multiples of this: the device's uniform and storage binding
    /// offset alignments, whichever is larger.
    alignment: u64,
    /// Holds back buffers released while this records, until it is submitted or dropped.
    open: OpenEncoder,
    /// Where dispatches find and keep their bind groups, if the owner keeps them.
    bind_groups: Option<Arc<BindGroupCache>>,
}

/// Part of a uniform buffer, filled on the CPU while dispatches are recorded and written to the
/// GPU when the encoder is submitted.
struct ParamsBlock {
    buffer: PooledBuffer,
    bytes: Vec<u8>,
}

/// Where one dispatch's parameters sit: bind it with [`ParamsSlot::binding`], as a uniform or
/// a read-only storage buffer.
pub struct ParamsSlot {
    buffer: wgpu::Buffer,
    offset: u64,
    size: NonZeroU64,
}

impl ParamsSlot {
    /// The parameters as a binding.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: Some(self.size),
        })
    }
}

impl Encoder {
    pub(crate) fn new(ctx: &GpuContext, label: &str) -> Self {
        let limits = ctx.limits();
        let alignment = u64::from(
            limits.min_uniform_buffer_offset_alignment.max(limits.min_storage_buffer_offset_alignment),
        );
        Encoder {
            raw: ctx.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) }),
            pass: None,
            params: Vec::new(),
            alignment: alignment.max(16),
            open: ctx.buffers.open_encoder(),
            bind_groups: None,
        }
    }

    /// Makes this encoder's dispatches find their bind groups in `cache` and keep new ones
    /// there; the cache's pass ends when this is submitted.
    pub fn keep_bind_groups(&mut self, cache: Arc<BindGroupCache>) {
        self.bind_groups = Some(cache);
    }

    /// The cache this encoder's dispatches use, if any.
    pub(crate) fn bind_groups(&self) -> Option<&BindGroupCache> {
        self.bind_groups.as_deref()
    }

    /// A place for `data` (a kernel's parameters) in this encoder's parameter buffer.
    ///
    /// Kernels read their parameters as uniforms, except those that read weights from textures
    /// ([`GpuFeatures::weight_textures`]): lavapipe compiles the values of uniforms into a
    /// shader variant, which pays off for buffer reads (loop bounds become constants) but costs
    /// ~4 ms each time a bind group with a texture is bound (measured on lavapipe 22.3).
    ///
    /// [`GpuFeatures::weight_textures`]: crate::gpu::GpuFeatures::weight_textures
    ///
    /// Fails only when a new block of parameters does not fit the memory budget.
    pub fn params<T: bytemuck::Pod>(&mut self, ctx: &GpuContext, data: &T) -> Result<ParamsSlot> {
        let bytes = bytemuck::bytes_of(data);
        // WGSL structs are sized in multiples of 16 bytes; a binding may not be empty.
        let size = (bytes.len() as u64).next_multiple_of(16).max(16);
        let alignment = self.alignment;
        let fits = |block: &ParamsBlock| {
            (block.bytes.len() as u64).next_multiple_of(alignment) + size <= block.buffer.buffer().size()
        };
        if self.params.last().is_none_or(|block| !fits(block)) {
            let usage =
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
            let buffer =
                ctx.buffers.acquire(ctx.device(), "flint params", PARAMS_BLOCK_BYTES.max(size), usage)?;
            self.params.push(ParamsBlock { buffer, bytes: Vec::new() });
        }
        let last = self.params.len() - 1;
        let block = &mut self.params[last];
        let offset = (block.bytes.len() as u64).next_multiple_of(alignment);
        block.bytes.resize(offset as usize, 0);
        block.bytes.extend_from_slice(bytes);
        block.bytes.resize((offset + size) as usize, 0);
        let size = NonZeroU64::new(size).unwrap_or(NonZeroU64::MIN);
        Ok(ParamsSlot { buffer: block.buffer.buffer().clone(), offset, size })
    }

    /// The open compute pass, opened now if there is none.
    pub(crate) fn shared_pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        let raw = &mut self.raw;
        self.pass.get_or_insert_with(|| {
            raw.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("flint kernels"),
                timestamp_writes: None,
            })
            .forget_lifetime()
        })
    }

    /// A pass of its own for one dispatch, timed with `timestamps` (a profile is open).
    pub(crate) fn timed_pass(
        &mut self,
        label: &str,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> wgpu::ComputePass<'_> {
        self.pass = None;
        self.raw.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes: timestamps,
        })
    }

    /// The command encoder, for commands other than dispatches (the open pass is closed first).
    pub fn raw(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        &mut self.raw
    }

    /// Records a copy of `size` bytes from `source` at `source_offset` to `destination` at
    /// `destination_offset`.
    pub fn copy_buffer_to_buffer(
        &mut self,
        source: &wgpu::Buffer,
        source_offset: u64,
        destination: &wgpu::Buffer,
        destination_offset: u64,
        size: u64,
    ) {
        self.raw().copy_buffer_to_buffer(source, source_offset, destination, destination_offset, size);
    }

    /// Writes the parameters (ahead of the commands, in queue order) and finishes the commands;
    /// the encoder counts as open until the returned guard is dropped, after the submission.
    pub(crate) fn finish(self, queue: &wgpu::Queue) -> (wgpu::CommandBuffer, OpenEncoder) {
        let Encoder { raw, pass, params, open, bind_groups, .. } = self;
        drop(pass);
        if let Some(cache) = bind_groups {
            cache.end_pass();
        }
        for block in &params {
            queue.write_buffer(block.buffer.buffer(), 0, &block.bytes);
        }
        (raw.finish(), open)
    }
}
