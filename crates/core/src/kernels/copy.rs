//! Bandwidth probes: a vec4 copy and a read-only vec4 reduction of a buffer
//! (`shaders/copy.wgsl`), and a read of a weight matrix as the kernels that read weights see it
//! (`shaders/read_weights.wgsl`).

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, QuantMatrix, Tensor};
use crate::kernels::ensure;
use crate::quant::QuantType;

const SOURCE: &str = include_str!("../../shaders/copy.wgsl");
const READ_WEIGHTS_SOURCE: &str = include_str!("../../shaders/read_weights.wgsl");
const WG_SIZE: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    count: u32,
    _pad: [u32; 3],
}

fn source(entry: &'static str) -> KernelSource {
    KernelSource::new(entry, &[SOURCE]).define("WG_SIZE", format!("{WG_SIZE}u"))
}

/// Records `dst = src`; both hold a multiple of 4 elements and the same length.
pub fn copy(ctx: &GpuContext, encoder: &mut Encoder, src: &Tensor, dst: &Tensor) -> Result<()> {
    ensure("copy_vec4", src.len() == dst.len() && src.len().is_multiple_of(4), || {
        format!(
            "src has {} elements and dst {}; both must be equal and a multiple of 4",
            src.len(),
            dst.len()
        )
    })?;
    let count = (src.len() / 4) as u32;
    let params = encoder.params(ctx, &Params { count, _pad: [0; 3] })?;
    let groups = ctx.grid(count.div_ceil(WG_SIZE));
    ctx.dispatch(encoder, &source("copy_vec4"), &[src.binding(), dst.binding(), params.binding()], groups)
}

/// Records a read of all of `src` (a multiple of 4 elements) by `groups` workgroups, each
/// invocation writing one word of `sink` (which needs `groups * 256` elements).
pub fn read(ctx: &GpuContext, encoder: &mut Encoder, src: &Tensor, sink: &Tensor, groups: u32) -> Result<()> {
    ensure("read_vec4", src.len().is_multiple_of(4) && sink.len() >= (groups * WG_SIZE) as usize, || {
        format!(
            "src has {} elements (must be a multiple of 4), sink {} (needs {})",
            src.len(),
            sink.len(),
            groups * WG_SIZE
        )
    })?;
    let params = encoder.params(ctx, &Params { count: (src.len() / 4) as u32, _pad: [0; 3] })?;
    ctx.dispatch(
        encoder,
        &source("read_vec4"),
        &[src.binding(), sink.binding(), params.binding()],
        ctx.grid(groups),
    )
}

/// Records a read of every 16 bytes of `weight` by `groups` workgroups a chunk, each invocation
/// writing one word of `sink` (which needs `groups * 256` elements).
pub fn read_weights(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    sink: &Tensor,
    groups: u32,
) -> Result<()> {
    ensure("read_weights", sink.len() >= (groups * WG_SIZE) as usize, || {
        format!("sink has {} elements, needs {}", sink.len(), groups * WG_SIZE)
    })?;
    let source = QuantMatrix::kernel_source(
        weight.quant(),
        weight.in_textures(),
        "read_weights",
        &[READ_WEIGHTS_SOURCE],
    )
    .define("WG_SIZE", format!("{WG_SIZE}u"));
    for chunk in weight.chunks() {
        let count = (chunk.rows * weight.row_words() / 4) as u32;
        let params = encoder.params(ctx, &Params { count, _pad: [0; 3] })?;
        ctx.dispatch(
            encoder,
            &source,
            &[chunk.binding(), sink.binding(), params.binding()],
            ctx.grid(groups),
        )?;
    }
    Ok(())
}

/// Memory bandwidth of the device, as its own kernels achieve it: the roofline that a
/// memory-bound kernel (decode's matrix × vector) is measured against.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Bandwidth {
    /// Bytes in the probe buffer.
    pub buffer_bytes: u64,
    /// Copy kernel: bytes read plus bytes written, per second.
    pub copy_bytes_per_s: f64,
    /// Read-only reduction kernel: bytes read per second.
    pub read_bytes_per_s: f64,
    /// The same reduction of a weight matrix of the same size, read as the kernels that read
    /// weights read it (from textures on CPU devices): bytes read per second.
    pub weight_read_bytes_per_s: f64,
}

impl Bandwidth {
    /// The fastest of the probes: the best rate at which a kernel here can stream memory.
    pub fn best_bytes_per_s(&self) -> f64 {
        self.best_buffer_bytes_per_s().max(self.weight_read_bytes_per_s)
    }

    /// The faster of the two buffer probes (copy and read of a storage buffer).
    pub fn best_buffer_bytes_per_s(&self) -> f64 {
        self.copy_bytes_per_s.max(self.read_bytes_per_s)
    }
}

/// Measures [`Bandwidth`] on a buffer of `buffer_bytes` (rounded down to whole vec4s, at least
/// one), taking the median of `repeats` timed runs after one warm-up (the first use of a buffer
/// pays for its zero-initialisation). `now_s` is the host's clock in seconds; the core has none
/// of its own since it also runs in the browser.
pub async fn measure_bandwidth(
    ctx: &GpuContext,
    buffer_bytes: u64,
    repeats: usize,
    now_s: &dyn Fn() -> f64,
) -> Result<Bandwidth> {
    let elements = ((buffer_bytes.min(ctx.max_binding_bytes()) / 16).max(1) * 4) as usize;
    let src = Tensor::empty(ctx, "bandwidth src", &[elements])?;
    let dst = Tensor::empty(ctx, "bandwidth dst", &[elements])?;
    // Enough workgroups to fill any device, few enough that the sink write is negligible.
    let read_groups = 1024u32;
    let sink = Tensor::empty(ctx, "bandwidth sink", &[(read_groups * WG_SIZE) as usize])?;
    let bytes = (elements * 4) as f64;
    // About the same bytes as an f32 matrix of rows of 8 words, stored as the model's weights are.
    let weight_rows = (elements / 8).max(1);
    let weight_bytes = (weight_rows * 8 * 4) as f64;
    let zeros = vec![0; weight_rows * 32];
    let weight = QuantMatrix::upload(ctx, "bandwidth weight", QuantType::F32, weight_rows, 8, &zeros)?;

    let time = async |record: &dyn Fn(&mut Encoder) -> Result<()>| -> Result<f64> {
        let mut runs = Vec::with_capacity(repeats + 1);
        for _ in 0..=repeats.max(1) {
            let start = now_s();
            let mut encoder = ctx.encoder("bandwidth");
            record(&mut encoder)?;
            ctx.submit(encoder)?;
            // A 4-byte readback waits for the work before it.
            ctx.read_bytes(sink.buffer(), 0, 4).await?;
            runs.push(now_s() - start);
        }
        runs.remove(0);
        runs.sort_by(f64::total_cmp);
        Ok(runs[runs.len() / 2])
    };
    let copy_s = time(&|encoder| copy(ctx, encoder, &src, &dst)).await?;
    let read_s = time(&|encoder| read(ctx, encoder, &src, &sink, read_groups)).await?;
    let weight_read_s = time(&|encoder| read_weights(ctx, encoder, &weight, &sink, read_groups)).await?;
    Ok(Bandwidth {
        buffer_bytes: bytes as u64,
        copy_bytes_per_s: 2.0 * bytes / copy_s,
        read_bytes_per_s: bytes / read_s,
        weight_read_bytes_per_s: weight_bytes / weight_read_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{POISON, Rng, both_paths, gpu};

    #[test]
    fn copy_moves_every_word() {
        let ctx = gpu();
        let mut rng = Rng::new("copy");
        for vec4s in [1usize, 255, 257, 70_001] {
            let data: Vec<u32> = (0..vec4s * 4).map(|_| rng.u32()).collect();
            let src = Tensor::from_slice(ctx, "src", &[data.len()], &data).unwrap();
            let dst = Tensor::empty(ctx, "dst", &[data.len()]).unwrap();
            dst.fill_bits(ctx, POISON);
            let mut encoder = ctx.encoder("test");
            copy(ctx, &mut encoder, &src, &dst).unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(dst.to_u32(ctx)).unwrap();
            assert_eq!(got, data, "copy of {vec4s} vec4s");
        }
    }

    #[test]
    fn read_reduces_every_word() {
        let ctx = gpu();
        let mut rng = Rng::new("read");
        let groups = 3u32;
        let data: Vec<u32> = (0..4 * 5003).map(|_| rng.u32()).collect();
        let src = Tensor::from_slice(ctx, "src", &[data.len()], &data).unwrap();
        let sink = Tensor::empty(ctx, "sink", &[(groups * WG_SIZE) as usize]).unwrap();
        sink.fill_bits(ctx, 0);
        let mut encoder = ctx.encoder("test");
        read(ctx, &mut encoder, &src, &sink, groups).unwrap();
        ctx.submit(encoder).unwrap();
        let got = pollster::block_on(sink.to_u32(ctx)).unwrap();
        assert_eq!(got, expected_sink(&data, groups));
    }

    /// What the read probes leave in the sink: invocation t xors vec4s t, t + stride, ...
    fn expected_sink(data: &[u32], groups: u32) -> Vec<u32> {
        let stride = (groups * WG_SIZE) as usize;
        (0..stride)
            .map(|t| {
                (t..data.len() / 4)
                    .step_by(stride)
                    .fold(0, |acc, i| acc ^ data[4 * i] ^ data[4 * i + 1] ^ data[4 * i + 2] ^ data[4 * i + 3])
            })
            .collect()
    }

    /// The weight probe reads every word, from textures and from storage buffers.
    #[test]
    fn read_weights_reduces_every_word() {
        let mut rng = Rng::new("read weights");
        for (path, ctx) in both_paths() {
            let groups = 3u32;
            let data: Vec<u32> = (0..8 * 2503).map(|_| rng.u32()).collect();
            let weight =
                QuantMatrix::upload(ctx, "w", QuantType::F32, 2503, 8, bytemuck::cast_slice(&data)).unwrap();
            let sink = Tensor::empty(ctx, "sink", &[(groups * WG_SIZE) as usize]).unwrap();
            sink.fill_bits(ctx, 0);
            let mut encoder = ctx.encoder("test");
            read_weights(ctx, &mut encoder, &weight, &sink, groups).unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(sink.to_u32(ctx)).unwrap();
            assert_eq!(got, expected_sink(&data, groups), "{path} (textures: {})", weight.in_textures());
        }
    }

    #[test]
    fn bandwidth_is_measured() {
        let ctx = gpu();
        let start = std::time::Instant::now();
        let clock = || start.elapsed().as_secs_f64();
        let bandwidth = pollster::block_on(measure_bandwidth(ctx, 1 << 20, 3, &clock)).unwrap();
        assert_eq!(bandwidth.buffer_bytes, 1 << 20);
        assert!(bandwidth.copy_bytes_per_s.is_finite() && bandwidth.copy_bytes_per_s > 0.0);
        assert!(bandwidth.read_bytes_per_s.is_finite() && bandwidth.read_bytes_per_s > 0.0);
        assert!(bandwidth.weight_read_bytes_per_s.is_finite() && bandwidth.weight_read_bytes_per_s > 0.0);
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let ctx = gpu();
        let a = Tensor::empty(ctx, "a", &[8]).unwrap();
        let b = Tensor::empty(ctx, "b", &[12]).unwrap();
        let mut encoder = ctx.encoder("test");
        let err = copy(ctx, &mut encoder, &a, &b).unwrap_err();
        assert!(err.to_string().contains("copy_vec4"), "{err}");
    }
}
