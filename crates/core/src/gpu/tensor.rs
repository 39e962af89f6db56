//! [`Tensor`]: an f32 or u32 array in a GPU storage buffer, with its shape.

use crate::gpu::GpuContext;
use crate::gpu::pool::PooledBuffer;
use crate::{Error, Result};

/// The largest uniform window ([`Tensor::window_binding`]) that kernels read a tensor through.
/// Where the device reads windows (`tuning::tensor_padding_bytes`), every tensor's buffer has
/// this many bytes past its elements, so that a window of a fixed size may start at any of its
/// rows (the window's size is compiled into the kernel, and a binding may not be smaller than
/// what the kernel declares).
pub const UNIFORM_WINDOW_BYTES: u64 = 1 << 16;

/// A dense array of 4-byte elements (f32 activations, or u32 ids) in one storage buffer.
/// Row-major; the last dimension is contiguous.
pub struct Tensor {
    /// From the context's pool, and back to it when the tensor is dropped.
    buffer: PooledBuffer,
    shape: Vec<usize>,
    /// Bytes of the buffer past the elements.
    padding: u64,
}

impl Tensor {
    /// An uninitialised tensor: it may hold what an earlier tensor of the same size left
    /// (its buffer is reused), so a kernel must write every element before any is read.
    pub fn empty(ctx: &GpuContext, label: &str, shape: &[usize]) -> Result<Self> {
        let elements: usize = shape.iter().product();
        let bytes = (elements.max(1) * 4) as u64;
        if bytes > ctx.max_binding_bytes() {
            return Err(Error::TooLarge {
                name: label.to_string(),
                bytes,
                reason: format!("one storage binding holds at most {} bytes", ctx.max_binding_bytes()),
            });
        }
        let padding = crate::tuning::tensor_padding_bytes(ctx.device_class());
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::UNIFORM
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let buffer = ctx.buffers.acquire(ctx.device(), label, bytes + padding, usage)?;
        Ok(Tensor { buffer, shape: shape.to_vec(), padding })
    }

    /// Bytes a tensor of `elements` takes from the device's memory once [`Tensor::empty`] has
    /// made it: its elements and the device's padding, rounded up to the buffer pool's size class.
    pub(crate) fn allocated_bytes(ctx: &GpuContext, elements: usize) -> u64 {
        let padding = crate::tuning::tensor_padding_bytes(ctx.device_class());
        crate::gpu::pool::size_class((elements.max(1) * 4) as u64 + padding)
    }

    /// A tensor holding `data` (f32, u32 or i32).
    pub fn from_slice<T: bytemuck::Pod>(
        ctx: &GpuContext,
        label: &str,
        shape: &[usize],
        data: &[T],
    ) -> Result<Self> {
        const { assert!(size_of::<T>() == 4, "tensors hold 4-byte elements") };
        let elements: usize = shape.iter().product();
        if elements != data.len() {
            return Err(Error::KernelArguments {
                kernel: "Tensor::from_slice",
                reason: format!("shape {shape:?} holds {elements} elements but {} were given", data.len()),
            });
        }
        let tensor = Self::empty(ctx, label, shape)?;
        if !data.is_empty() {
            ctx.queue().write_buffer(tensor.buffer(), 0, bytemuck::cast_slice(data));
        }
        Ok(tensor)
    }

    /// Overwrites every element with the bit pattern `bits` (tests poison outputs with NaN so an
    /// element that a kernel fails to write is caught).
    pub fn fill_bits(&self, ctx: &GpuContext, bits: u32) {
        let words = vec![bits; (self.buffer().size() / 4) as usize];
        ctx.queue().write_buffer(self.buffer(), 0, bytemuck::cast_slice(&words));
    }

    /// Reads the tensor back as f32.
    pub async fn to_f32(&self, ctx: &GpuContext) -> Result<Vec<f32>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read(ctx).await?))
    }

    /// Reads the tensor back as u32.
    pub async fn to_u32(&self, ctx: &GpuContext) -> Result<Vec<u32>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read(ctx).await?))
    }

    async fn read(&self, ctx: &GpuContext) -> Result<Vec<u8>> {
        ctx.read_bytes(self.buffer(), 0, (self.len() * 4) as u64).await
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The storage buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.buffer()
    }

    /// The elements as a binding (without the padding of CPU devices).
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        self.window_binding(0, (self.len().max(1) * 4) as u64)
    }

    /// Whether `other` is this very tensor (the same GPU buffer).
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        self.buffer() == other.buffer()
    }

    /// Bytes of the buffer past the elements, which a window may reach into.
    pub fn window_padding(&self) -> u64 {
        self.padding
    }

    /// `size` bytes from byte `offset` on as a binding: a uniform window, which on CPU devices
    /// may reach up to [`UNIFORM_WINDOW_BYTES`] past the last element into the padding.
    pub fn window_binding(&self, offset: u64, size: u64) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.buffer(),
            offset,
            size: wgpu::BufferSize::new(size),
        })
    }
}
