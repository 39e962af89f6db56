//! Every choice that depends on the kind of device: the kernel files define their variants and
//! ask here which one a device runs. Nothing else reads the adapter's device type, but the
//! adapter ranking in `gpu/context.rs`, which runs before any device is open.
//!
//! Each choice is a function of the device's [`DeviceClass`] and the shapes it needs, matching
//! on the class without a wildcard: a new class (say `AppleGpu`) is one variant and its line in
//! [`DeviceClass::of`], then the compiler points at each row it needs here, to be measured on
//! that device. The measurements behind the rows are in `BENCHMARKS.md` ("Tuning tables").

use crate::gpu::quant_types::DecoderSize;
use crate::gpu::{GpuContext, UNIFORM_WINDOW_BYTES};
use crate::kernels::attention::{DECODE_SERIAL_WG, DECODE_WG, DecodeVariant, PrefillVariant};
use crate::kernels::matmul::{Reduce, TILED, TILED_ROWS, Variant, uniform_window_rows};
use crate::kernels::norm::REDUCTION_WG_SIZE;
use crate::quant::QuantType;

/// The kind of device, as far as the kernels' tuning goes. Built once per device
/// ([`GpuContext::device_class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    /// Vulkan in software on the CPU (Mesa's lavapipe, SwiftShader): a workgroup runs on one
    /// thread, its invocations as SIMD lanes, so barriers and storage loads are costly.
    Cpu,
    /// Every other device: discrete, integrated and virtual GPUs, and adapters that do not say.
    Gpu,
}

impl DeviceClass {
    /// The class of the adapter that `info` describes.
    pub(crate) fn of(info: &wgpu::AdapterInfo) -> Self {
        match info.device_type {
            wgpu::DeviceType::Cpu => DeviceClass::Cpu,
            wgpu::DeviceType::DiscreteGpu
            | wgpu::DeviceType::IntegratedGpu
            | wgpu::DeviceType::VirtualGpu
            | wgpu::DeviceType::Other => DeviceClass::Gpu,
        }
    }
}

/// Whether `WeightStorage::Auto` keeps weights in textures: on CPU devices a texel load is a
/// gather where a storage load is a loop over the lanes, so products read weights 2-3x faster.
pub(crate) fn weights_in_textures(class: DeviceClass) -> bool {
    match class {
        DeviceClass::Cpu => true,
        DeviceClass::Gpu => false,
    }
}

/// Whether the engine overlaps decode steps by default (`EngineOptions::overlap_steps`): on a
/// CPU device the "GPU" is the host's own cores, and recording the next step beside it slows
/// both.
pub(crate) fn overlaps_steps(class: DeviceClass) -> bool {
    match class {
        DeviceClass::Cpu => false,
        DeviceClass::Gpu => true,
    }
}

/// Bytes past the elements of every tensor's buffer: CPU devices read activations through
/// uniform windows ([`matmul_variant`]) that may start at any row and reach this far past it.
pub(crate) fn tensor_padding_bytes(class: DeviceClass) -> u64 {
    match class {
        DeviceClass::Cpu => UNIFORM_WINDOW_BYTES,
        DeviceClass::Gpu => 0,
    }
}

/// Invocations per workgroup on CPU devices where the adapter does not say its SIMD width: one
/// SIMD group of lavapipe's default 256-bit vectors.
const CPU_WG_SIZE: u32 = 8;

/// Invocations per workgroup on a CPU device: one SIMD group, which is what a CPU device's
/// subgroup is (lavapipe: 8 lanes at its default 256-bit vectors, 16 with
/// `LP_NATIVE_VECTOR_WIDTH=512`, where workgroups of 8 leave half of each vector idle).
fn cpu_wg_size(subgroup_max_size: u32) -> u32 {
    match subgroup_max_size {
        0 => CPU_WG_SIZE,
        lanes => lanes.next_power_of_two().clamp(CPU_WG_SIZE, 64),
    }
}

/// A GPU product with this many rows has workgroups enough at any batch: tiles of 4 batch rows
/// from 2 on, and 8 invocations a row where rows are short (an LM head: SmolLM2's 49152 × 576
/// Q8_0 at batch 4 took 59 µs so, against 137 with 32 invocations and one batch row).
const GPU_MANY_ROWS: usize = 8192;

/// GPUs take the tiled kernel from this many batch rows on, when the product has at least
/// [`TILED_MIN_BLOCKS`] blocks of 64 × 64.
const TILED_MIN_BATCH: usize = 32;
/// See [`TILED_MIN_BATCH`].
const TILED_MIN_BLOCKS: usize = 64;

/// The matmul variant for `batch` rows of activations on this device.
///
/// CPU devices: an invocation sums a tile of rows × batch rows alone (barriers are costly), the
/// largest tile the type's decoder lets the driver unroll; with subgroups x is broadcast from
/// one lane and read through uniform windows (storage loads are loops over the lanes).
/// GPUs: many invocations a row for coalesced loads, added by subgroup shuffles where
/// available; the tiled kernel for large batches of many rows.
pub(crate) fn matmul_variant(
    ctx: &GpuContext,
    quant: QuantType,
    rows: usize,
    cols: usize,
    batch: usize,
) -> Variant {
    let info = ctx.adapter_info();
    match ctx.device_class() {
        DeviceClass::Cpu => {
            let x_broadcast = ctx.features().subgroups && info.subgroup_min_size >= 8;
            let (row_tile, batch_tile) = match (quant.gpu().decoder_size, batch, x_broadcast) {
                (DecoderSize::Small, 1, true) => (8, 1),
                (DecoderSize::Small, _, true) => (4, 4),
                (DecoderSize::Small, 1, false) => (2, 1),
                (DecoderSize::Small, 2..=4, false) => (4, 4),
                (DecoderSize::Small, 5..=8, false) => (2, 8),
                (DecoderSize::Small, _, false) => (8, 16),
                (DecoderSize::Medium, 1, _) => (2, 1),
                (DecoderSize::Medium, 2..=4, true) => (4, 4),
                (DecoderSize::Medium, 2..=4, false) => (2, 4),
                (DecoderSize::Medium, _, _) => (2, 8),
                (DecoderSize::Large, 1, _) => (1, 1),
                (DecoderSize::Large, _, true) => (1, 4),
                (DecoderSize::Large, 2..=4, false) => (1, 4),
                (DecoderSize::Large, _, false) => (4, 16),
            };
            Variant {
                wg_size: cpu_wg_size(info.subgroup_max_size),
                threads_per_row: 1,
                row_tile,
                batch_tile,
                reduce: Reduce::None,
                x_broadcast,
                x_window_rows: if x_broadcast {
                    uniform_window_rows(ctx, cols, UNIFORM_WINDOW_BYTES, batch_tile)
                } else {
                    None
                },
                tiled: false,
            }
        }
        DeviceClass::Gpu => {
            if batch >= TILED_MIN_BATCH
                && rows.div_ceil(TILED_ROWS as usize) * batch.div_ceil(TILED.batch_tile as usize)
                    >= TILED_MIN_BLOCKS
            {
                TILED
            } else if ctx.features().subgroups {
                let widest = info.subgroup_min_size.clamp(1, 32).next_power_of_two();
                let many_rows = rows >= GPU_MANY_ROWS;
                let threads_per_row =
                    if cols < 1024 && (batch > 1 || many_rows) { widest.min(8) } else { widest };
                let batch_tile = if batch > 1 && (batch > 8 || many_rows) { 4 } else { 1 };
                Variant {
                    wg_size: 128,
                    threads_per_row,
                    row_tile: 1,
                    batch_tile,
                    reduce: Reduce::Subgroup,
                    x_broadcast: false,
                    x_window_rows: None,
                    tiled: false,
                }
            } else {
                let batch_tile = match batch {
                    1 => 1,
                    2..=4 => 4,
                    _ => 8,
                };
                Variant {
                    wg_size: 128,
                    threads_per_row: 32,
                    row_tile: 1,
                    batch_tile,
                    reduce: Reduce::Shared,
                    x_broadcast: false,
                    x_window_rows: None,
                    tiled: false,
                }
            }
        }
    }
}

/// Whether a product of `batch` rows takes a residual input rather than a joint pass before it.
/// Every workgroup of the product computes the joint again: GPUs pay that in cached loads for a
/// dispatch saved, CPU devices in arithmetic that pays only at one row.
pub(crate) fn fuses_residual_input(class: DeviceClass, batch: usize) -> bool {
    match class {
        DeviceClass::Cpu => batch == 1,
        DeviceClass::Gpu => true,
    }
}

/// Split decode on GPUs: workgroups to aim for over a step's (sequence, kv head, chunk) groups
/// and their spans of keys; a few per compute unit of a large GPU (an H200 has 132).
const DECODE_SPLIT_WORKGROUPS: usize = 256;

/// The decode attention variant for this device, given the (sequence, kv head, chunk) groups of
/// a step, the query heads of a chunk, their size, and the most keys a sequence can have.
/// GPUs split the keys over more workgroups where a step has too few groups to fill the device;
/// CPU devices with subgroups take the serial variant, whose lanes walk the keys together.
pub(crate) fn decode_variant(
    ctx: &GpuContext,
    chunks: usize,
    group_heads: usize,
    head_dim: usize,
    key_capacity: usize,
) -> DecodeVariant {
    match ctx.device_class() {
        DeviceClass::Gpu => {
            // Spans of at least a tile of keys each, as many as bring the step to its target.
            let splits =
                (DECODE_SPLIT_WORKGROUPS / chunks.max(1)).min(key_capacity.div_ceil(DECODE_WG as usize));
            if splits <= 1 {
                return DecodeVariant::Workgroups;
            }
            DecodeVariant::Split {
                key_span: key_capacity.div_ceil(splits).next_multiple_of(DECODE_WG as usize),
            }
        }
        DeviceClass::Cpu => {
            if !serial_runs(ctx) {
                return DecodeVariant::Workgroups;
            }
            // Each lane's loads cost the most, so a workgroup serves as many heads as it can
            // (each key and value loaded once for all), yet no fewer workgroups than the machine
            // has threads (lavapipe runs one per CPU) while fewer heads can give that many.
            let threads = cpu_threads();
            let groups = |heads: usize| chunks * (group_heads / heads);
            let largest = serial_max_group_heads(group_heads, head_dim);
            let group_heads = (1..=largest)
                .rev()
                .filter(|d| largest.is_multiple_of(*d))
                .find(|&d| groups(d) >= threads)
                .unwrap_or(1);
            DecodeVariant::Serial { group_heads, kv_textures: ctx.features().weight_textures }
        }
    }
}

/// The prefill attention variant for this device, given the query heads of a chunk and their
/// size: GPUs share tiles of keys among a workgroup's rows; CPU devices with subgroups take the
/// serial variant at one token a workgroup (tiles of tokens ran no faster on lavapipe).
pub(crate) fn prefill_variant(ctx: &GpuContext, chunk_heads: usize, head_dim: usize) -> PrefillVariant {
    match ctx.device_class() {
        DeviceClass::Cpu if serial_runs(ctx) => PrefillVariant::Serial {
            group_heads: serial_max_group_heads(chunk_heads, head_dim),
            rows: 1,
            kv_textures: ctx.features().weight_textures,
        },
        DeviceClass::Cpu | DeviceClass::Gpu => PrefillVariant::Workgroups,
    }
}

/// Whether the serial attention variants run here: their lanes must lie in one subgroup.
fn serial_runs(ctx: &GpuContext) -> bool {
    ctx.features().subgroups && ctx.adapter_info().subgroup_min_size >= DECODE_SERIAL_WG
}

/// The machine's CPU threads, looked up once (on Linux the lookup reads cgroup files, too slow
/// for every decode dispatch).
fn cpu_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

/// The serial attention variants' lanes each hold a slice of their heads' queries and
/// accumulators in registers: at most this many values across the heads, so they stay there.
pub(crate) const SERIAL_MAX_HEAD_VALUES: usize = 512;

/// The most heads of a chunk of `chunk_heads` that a serial workgroup may serve: the largest
/// divisor of the chunk within [`SERIAL_MAX_HEAD_VALUES`].
pub(crate) fn serial_max_group_heads(chunk_heads: usize, head_dim: usize) -> usize {
    (1..=chunk_heads)
        .rev()
        .find(|d| chunk_heads.is_multiple_of(*d) && d * head_dim <= SERIAL_MAX_HEAD_VALUES)
        .unwrap_or(1)
}

/// How many rows one workgroup of a row reduction (RMSNorm, softmax) handles, each row by its
/// own team of lanes (see `shaders/norm.wgsl`).
pub(crate) fn reduction_rows_per_workgroup(ctx: &GpuContext) -> u32 {
    if ctx.features().subgroups {
        // A team is a subgroup: as many rows as the narrowest subgroups make teams.
        return REDUCTION_WG_SIZE / ctx.adapter_info().subgroup_min_size.clamp(1, REDUCTION_WG_SIZE);
    }
    match ctx.device_class() {
        // A workgroup runs on one core, its invocations in SIMD chunks of about 8: a row is as
        // fast on 8 lanes as on 64, and 8 rows then share each (costly) barrier.
        DeviceClass::Cpu => REDUCTION_WG_SIZE / 8,
        // All 64 lanes on one row, so that even a single row is read in parallel.
        DeviceClass::Gpu => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU workgroups are one SIMD group, a power of two from 8 to 64.
    #[test]
    fn cpu_workgroups_are_one_simd_group() {
        assert_eq!(cpu_wg_size(0), CPU_WG_SIZE);
        assert_eq!([4, 8, 16, 12, 128].map(cpu_wg_size), [8, 8, 16, 16, 64]);
    }
}
