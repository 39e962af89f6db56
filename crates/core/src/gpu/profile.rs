//! Per-kernel GPU time from timestamp queries: while a profile is open, every dispatch writes
//! a timestamp at the start and at the end of its compute pass, labelled with its kernel's
//! entry point; [`GpuContext::finish_profile`] reads them back as one [`KernelTime`] per
//! dispatch. Needs the `TIMESTAMP_QUERY` feature ([`GpuFeatures::timestamps`]).
//!
//! ```no_run
//! # async fn example(ctx: &flint_core::gpu::GpuContext) -> flint_core::Result<()> {
//! ctx.start_profile(4096)?;
//! // ... record and submit work ...
//! for time in ctx.finish_profile().await? {
//!     println!("{}: {:.1} µs", time.kernel, time.seconds * 1e6);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`GpuFeatures::timestamps`]: crate::gpu::GpuFeatures::timestamps

use crate::gpu::GpuContext;
use crate::{Error, Result};

/// How long one dispatch ran on the GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel's entry point (`matmul`, `rms_norm`, ...).
    pub kernel: &'static str,
    /// Seconds from the start to the end of its compute pass.
    pub seconds: f64,
}

/// An open profile: the query set the dispatches write into, and whose each pair is.
pub(crate) struct Profile {
    queries: wgpu::QuerySet,
    capacity: u32,
    labels: Vec<&'static str>,
    /// A dispatch found no place left.
    overflowed: bool,
}

impl Profile {
    /// The timestamp writes for the next dispatch, labelled `kernel`; `None` once the query set
    /// is full (later dispatches go unmeasured, and [`GpuContext::finish_profile`] says so).
    pub(crate) fn next_pass(&mut self, kernel: &'static str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let first = 2 * self.labels.len() as u32;
        if first + 2 > self.capacity {
            self.overflowed = true;
            return None;
        }
        self.labels.push(kernel);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(first),
            end_of_pass_write_index: Some(first + 1),
        })
    }
}

impl GpuContext {
    /// Starts timing every dispatch from now on, up to `max_dispatches` of them. An error when
    /// the device has no timestamp queries.
    pub fn start_profile(&self, max_dispatches: u32) -> Result<()> {
        if !self.features().timestamps {
            return Err(Error::Gpu(format!(
                "the adapter '{}' was opened without timestamp queries, so kernels cannot be timed",
                self.adapter_info().name
            )));
        }
        let capacity = 2 * max_dispatches.clamp(1, wgpu::QUERY_SET_MAX_QUERIES / 2);
        let queries = self.device().create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("flint profile"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        *self.lock_profile()? = Some(Profile { queries, capacity, labels: Vec::new(), overflowed: false });
        Ok(())
    }

    /// Stops timing and returns the time of every dispatch since [`GpuContext::start_profile`],
    /// in order. The work must have been submitted. An error when more dispatches ran than the
    /// profile had room for.
    pub async fn finish_profile(&self) -> Result<Vec<KernelTime>> {
        let profile = self
            .lock_profile()?
            .take()
            .ok_or_else(|| Error::Gpu("finish_profile without start_profile".into()))?;
        if profile.overflowed {
            return Err(Error::Gpu(format!(
                "more dispatches ran than the profile's {} places: start it with more",
                profile.capacity / 2
            )));
        }
        if profile.labels.is_empty() {
            return Ok(Vec::new());
        }
        let used = 2 * profile.labels.len() as u32;
        let bytes = used as u64 * 8;
        self.count_created_buffer();
        let resolved = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("flint profile resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut encoder = self.encoder("flint profile resolve");
        encoder.raw().resolve_query_set(&profile.queries, 0..used, &resolved, 0);
        self.submit(encoder)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&self.read_bytes(&resolved, 0, bytes).await?);
        let period_ns = self.queue().get_timestamp_period() as f64;
        Ok(profile
            .labels
            .iter()
            .zip(ticks.chunks_exact(2))
            .map(|(&kernel, pair)| KernelTime {
                kernel,
                seconds: pair[1].saturating_sub(pair[0]) as f64 * period_ns * 1e-9,
            })
            .collect())
    }

    pub(crate) fn lock_profile(&self) -> Result<std::sync::MutexGuard<'_, Option<Profile>>> {
        self.profile.lock().map_err(|_| Error::Gpu("the profile's lock is poisoned".into()))
    }
}

#[cfg(test)]
mod tests {
    use crate::gpu::{GpuContext, GpuOptions, Tensor};
    use crate::kernels::elementwise::{add_in_place, scale_in_place};

    #[test]
    fn every_dispatch_is_timed_under_its_kernel_name() {
        // A device of its own: other tests' dispatches on a shared one would be timed too.
        let ctx = &*pollster::block_on(GpuContext::new(&GpuOptions::from_env())).unwrap();
        let x = Tensor::from_slice(ctx, "x", &[1 << 16], &vec![1.0f32; 1 << 16]).unwrap();
        let y = Tensor::from_slice(ctx, "y", &[1 << 16], &vec![2.0f32; 1 << 16]).unwrap();
        let record = |dispatches: usize| {
            let mut encoder = ctx.encoder("profiled");
            for _ in 0..dispatches / 2 {
                scale_in_place(ctx, &mut encoder, &x, 0.5).unwrap();
                add_in_place(ctx, &mut encoder, &x, &y).unwrap();
            }
            ctx.submit(encoder).unwrap();
        };
        ctx.start_profile(8).unwrap();
        record(6);
        let times = pollster::block_on(ctx.finish_profile()).unwrap();
        let kernels: Vec<&str> = times.iter().map(|t| t.kernel).collect();
        assert_eq!(kernels, ["scale", "add", "scale", "add", "scale", "add"]);
        assert!(times.iter().all(|t| t.seconds > 0.0 && t.seconds < 1.0), "{times:?}");
        // Work outside a profile is not timed; a profile too small for its work says so.
        record(2);
        ctx.start_profile(3).unwrap();
        record(4);
        let error = pollster::block_on(ctx.finish_profile()).unwrap_err().to_string();
        assert!(error.contains("3 places"), "{error}");
        assert!(pollster::block_on(ctx.finish_profile()).is_err(), "no profile is open");
    }
}
