//! Shared pieces of the kernel tests: the GPU, seeded random inputs, poison, error bounds. The
//! kernel timings (feature `kernel-timing`) use the devices and the random inputs.
#![cfg_attr(not(test), allow(dead_code))]

use std::sync::{Arc, OnceLock};

use rand::{Rng as _, SeedableRng};

use crate::gpu::{GpuContext, GpuOptions};

/// NaN bit pattern written into outputs before a kernel runs: an element it fails to write
/// stays NaN and fails every comparison.
pub const POISON: u32 = 0x7fc0_dead;

fn open(options: GpuOptions) -> Arc<GpuContext> {
    pollster::block_on(GpuContext::new(&options))
        .unwrap_or_else(|e| panic!("kernel tests need a GPU adapter (they never skip): {e}"))
}

/// The test device with every optional feature it has (subgroups, f16 ...). `FLINT_ADAPTER`
/// picks the adapter.
pub fn gpu() -> &'static GpuContext {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| open(GpuOptions { portable_only: false, ..GpuOptions::from_env() }))
}

/// The same adapter opened with no optional feature: the portable paths every device runs.
pub fn gpu_portable() -> &'static GpuContext {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| open(GpuOptions { portable_only: true, ..GpuOptions::from_env() }))
}

/// Both test devices, for kernels with a fast path: each test body runs once per path.
pub fn both_paths() -> [(&'static str, &'static GpuContext); 2] {
    [("features", gpu()), ("portable", gpu_portable())]
}

/// A seeded random source. The seed is fresh each run (or `FLINT_TEST_SEED`) and printed, so a
/// failure can be replayed.
pub struct Rng(rand::rngs::StdRng);

impl Rng {
    /// A generator for the test named `what`.
    pub fn new(what: &str) -> Self {
        let seed = std::env::var("FLINT_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::rng().random::<u64>());
        eprintln!("{what}: FLINT_TEST_SEED={seed}");
        Rng(rand::rngs::StdRng::seed_from_u64(seed))
    }

    /// A uniform u32.
    pub fn u32(&mut self) -> u32 {
        self.0.random()
    }

    /// A uniform f32 in `[lo, hi)`.
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        self.0.random_range(lo..hi)
    }

    /// `n` uniform f32 in `[lo, hi)`.
    pub fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(lo, hi)).collect()
    }

    /// A uniform usize in `[lo, hi)`.
    pub fn usize(&mut self, lo: usize, hi: usize) -> usize {
        self.0.random_range(lo..hi)
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.0.random()).collect()
    }
}

/// Asserts `|actual - expected| <= tol * max(|expected|, scale)` elementwise, where `scale`
/// (the RMS of `expected`) keeps near-zero elements of a sum from demanding impossible relative
/// precision. The message names the first bad index with both values.
pub fn assert_close(what: &str, actual: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    let rms = (expected.iter().map(|e| e * e).sum::<f32>() / expected.len().max(1) as f32).sqrt();
    let scale = rms.max(f32::MIN_POSITIVE);
    let mut worst = (0.0f32, 0usize);
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let err = (a - e).abs() / e.abs().max(scale);
        assert!(
            err <= tol,
            "{what}: element {i} of {}: got {a}, expected {e} (relative error {err:.3e} > {tol:.1e})",
            actual.len()
        );
        if err > worst.0 {
            worst = (err, i);
        }
    }
    eprintln!("{what}: worst relative error {:.3e} at {}", worst.0, worst.1);
}

/// Parses and validates a kernel variant with naga on the CPU, as wgpu's own tests do: catches a
/// broken define set even where no test dispatches it.
#[cfg(test)]
pub fn validate_wgsl(source: &crate::gpu::KernelSource) {
    let wgsl = source.wgsl();
    let module = naga::front::wgsl::parse_str(&wgsl)
        .unwrap_or_else(|e| panic!("{}: {}", source.entry, e.emit_to_string(&wgsl)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", source.entry, e.emit_to_string(&wgsl)));
}
