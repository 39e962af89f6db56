//! The GPU runtime: one [`GpuContext`] per device, with its buffers and compiled pipelines.
//!
//! Kernels never see requests and the engine never sees WGSL: launchers in
//! [`crate::kernels`] take a context, [`Tensor`]s and an [`Encoder`], and record dispatches.

mod bind_groups;
mod context;
mod encoder;
mod memory;
mod pipeline;
mod pool;
mod profile;
pub(crate) mod quant_types;
mod readback;
mod tensor;
pub(crate) mod weight;

pub use crate::tuning::DeviceClass;
pub use bind_groups::BindGroupCache;
pub use context::{CreatedObjects, DeviceDescription, GpuContext, GpuFeatures, GpuOptions, WeightStorage};
pub use encoder::{Encoder, ParamsSlot};
pub use memory::host_available_memory;
pub use pipeline::{KernelSource, preprocess};
pub use profile::KernelTime;
pub use readback::Readback;
pub use tensor::{Tensor, UNIFORM_WINDOW_BYTES};
pub use weight::QuantMatrix;
