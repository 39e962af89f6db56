//! The WGSL kernel library (`shaders/`, one file per family) and the launchers that record it.
//!
//! Every launcher takes the [`GpuContext`](crate::gpu::GpuContext), a command encoder and its
//! tensors, checks that the shapes fit together, and records its dispatches; nothing is
//! submitted or read back here. Each family's tests compare with a plain CPU reference on random
//! inputs of awkward sizes, outputs poisoned with NaN first.

pub mod attention;
pub mod copy;
pub mod elementwise;
pub mod embedding;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod sample;

#[cfg(any(test, feature = "kernel-timing"))]
pub(crate) mod testing;

/// Checks a kernel argument, returning a [`crate::Error::KernelArguments`] that names the kernel.
pub(crate) fn ensure(kernel: &'static str, ok: bool, reason: impl FnOnce() -> String) -> crate::Result<()> {
    if ok { Ok(()) } else { Err(crate::Error::KernelArguments { kernel, reason: reason() }) }
}
