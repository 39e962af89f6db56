//! [`Readback`]: bytes of a GPU buffer on their way to the CPU, copied by commands recorded in an
//! encoder and read once that encoder's submission has run.
//!
//! Recorded into the same encoder as the work that writes them, the copy costs no submission
//! of its own, and waiting for it waits for that submission only: the engine submits the next
//! step and then reads this one's draws while the GPU runs it.

use futures::channel::oneshot;

use crate::gpu::pool::PooledBuffer;
use crate::gpu::{Encoder, GpuContext};
use crate::{Error, Result};

/// A copy of a buffer range into a mappable staging buffer, recorded and not yet read.
pub struct Readback {
    staging: PooledBuffer,
    /// Bytes wanted, and bytes copied (rounded up to the copy alignment).
    size: u64,
    copied: u64,
    /// The submission that copies, once [`Readback::start`] knows it.
    submission: Option<wgpu::SubmissionIndex>,
    mapped: Option<oneshot::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>>,
}

impl GpuContext {
    /// Records into `encoder` a copy of `size` bytes of `buffer` from `offset`, to be read
    /// back with [`Readback::start`] once the encoder is submitted, then [`Readback::finish`].
    pub fn record_readback(
        &self,
        encoder: &mut Encoder,
        buffer: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Readback> {
        let copied = size.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        let mut staging = self.buffers.acquire(
            self.device(),
            "flint readback",
            copied,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        // Mapped or being mapped, it may not be copied into: should this fail or be dropped
        // half-way, the buffer is freed rather than pooled.
        staging.set_returns_to_pool(false);
        encoder.copy_buffer_to_buffer(buffer, offset, staging.buffer(), 0, copied);
        Ok(Readback { staging, size, copied, submission: None, mapped: None })
    }

    /// Copies `size` bytes of `buffer` from `offset` back to the CPU.
    ///
    /// Natively this waits on the device (the host runs the engine on its own thread); on the web
    /// it awaits the `mapAsync` callback and never blocks.
    pub async fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        let mut encoder = self.encoder("flint readback");
        let mut readback = self.record_readback(&mut encoder, buffer, offset, size)?;
        self.submit(encoder)?;
        readback.start(self);
        readback.finish(self).await
    }
}

impl Readback {
    /// Starts mapping the copy: call once the encoder it was recorded into has been submitted,
    /// before anything else is.
    pub fn start(&mut self, ctx: &GpuContext) {
        if self.mapped.is_some() {
            return;
        }
        self.submission = ctx.last_submission();
        let (sender, receiver) = oneshot::channel();
        self.staging.buffer().slice(..self.copied).map_async(wgpu::MapMode::Read, move |result| {
            let _ = sender.send(result);
        });
        self.mapped = Some(receiver);
    }

    /// The bytes, once the submission that copies them has run (natively this waits for that
    /// submission only, not for later ones).
    pub async fn finish(mut self, ctx: &GpuContext) -> Result<Vec<u8>> {
        self.start(ctx);
        #[cfg(not(target_arch = "wasm32"))]
        ctx.device()
            .poll(wgpu::PollType::Wait { submission_index: self.submission.take(), timeout: None })
            .map_err(|e| Error::Readback(e.to_string()))?;
        let mapped = self.mapped.take().ok_or_else(|| Error::Readback("the copy was never mapped".into()))?;
        mapped
            .await
            .map_err(|_| Error::Readback("the device was lost before the copy finished".into()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        ctx.check_errors()?;
        let staging = self.staging.buffer();
        let view =
            staging.slice(..self.copied).get_mapped_range().map_err(|e| Error::Readback(e.to_string()))?;
        let mut bytes = view.to_vec();
        bytes.truncate(self.size as usize);
        drop(view);
        staging.unmap();
        self.staging.set_returns_to_pool(true);
        Ok(bytes)
    }
}
