//! What the GPU needs to know about each quant type, in one table per type: which bytes of a
//! block the upload moves out of it ([`crate::gpu::weight`]'s layout), the WGSL decoder and the
//! parts it needs, and how much code it is (which the tuning tables read). A new quant type is
//! a new decoder in `shaders/quant/` and a new table here.

use std::ops::Range;

use crate::quant::QuantType;

/// Bytes `at .. at + len` of a GGUF block.
#[derive(Clone, Copy)]
pub(crate) struct Field {
    pub(crate) at: usize,
    pub(crate) len: usize,
}

impl Field {
    pub(crate) fn range(self) -> Range<usize> {
        self.at..self.at + self.len
    }
}

/// How much code a type's block decoder is, which bounds the tile a CPU device runs well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecoderSize {
    Small,
    Medium,
    Large,
}

/// The GPU facts of one quant type.
pub(crate) struct GpuQuant {
    /// The fields the upload moves out of each block into arrays after the row's block bodies,
    /// in the order of those arrays; empty for types stored as they are.
    pub(crate) moved_fields: &'static [Field],
    /// The decoder (`decode8()`, and `load32()` where `own_load32`).
    pub(crate) decoder: &'static str,
    /// Whether the decoder uses the K-quant scale helpers (`k_scales.wgsl`, before it).
    pub(crate) k_scales: bool,
    /// Whether the decoder reads a block's words once for 32 weights in a `load32()` of its
    /// own; the others get `block32.wgsl`'s, built from four `decode8()`.
    pub(crate) own_load32: bool,
    /// How much code the decoder is.
    pub(crate) decoder_size: DecoderSize,
}

/// The f16 scale at the start of a block.
const SCALE_FIRST: Field = Field { at: 0, len: 2 };

const F32: GpuQuant = GpuQuant {
    moved_fields: &[],
    decoder: include_str!("../../shaders/quant/f32.wgsl"),
    k_scales: false,
    own_load32: false,
    decoder_size: DecoderSize::Medium,
};

const F16: GpuQuant = GpuQuant {
    moved_fields: &[],
    decoder: include_str!("../../shaders/quant/f16.wgsl"),
    k_scales: false,
    own_load32: false,
    decoder_size: DecoderSize::Medium,
};

const BF16: GpuQuant = GpuQuant {
    moved_fields: &[],
    decoder: include_str!("../../shaders/quant/bf16.wgsl"),
    k_scales: false,
    own_load32: false,
    decoder_size: DecoderSize::Medium,
};

/// 18-byte blocks: the scale moves out, leaving 16 bytes of nibbles.
const Q4_0: GpuQuant = GpuQuant {
    moved_fields: &[SCALE_FIRST],
    decoder: include_str!("../../shaders/quant/q4_0.wgsl"),
    k_scales: false,
    own_load32: true,
    decoder_size: DecoderSize::Small,
};

/// 20-byte blocks whose nibbles start one word off a 16-byte boundary: scale and offset move.
const Q4_1: GpuQuant = GpuQuant {
    moved_fields: &[Field { at: 0, len: 4 }],
    decoder: include_str!("../../shaders/quant/q4_1.wgsl"),
    k_scales: false,
    own_load32: true,
    decoder_size: DecoderSize::Small,
};

/// 22-byte blocks: the fifth bits, then the scale, move out.
const Q5_0: GpuQuant = GpuQuant {
    moved_fields: &[Field { at: 2, len: 4 }, SCALE_FIRST],
    decoder: include_str!("../../shaders/quant/q5_0.wgsl"),
    k_scales: false,
    own_load32: true,
    decoder_size: DecoderSize::Medium,
};

/// 24-byte blocks, whole words: stored as they are.
const Q5_1: GpuQuant = GpuQuant {
    moved_fields: &[],
    decoder: include_str!("../../shaders/quant/q5_1.wgsl"),
    k_scales: false,
    own_load32: false,
    decoder_size: DecoderSize::Large,
};

/// 34-byte blocks: the scale moves out, leaving 32 bytes of weights.
const Q8_0: GpuQuant = GpuQuant {
    moved_fields: &[SCALE_FIRST],
    decoder: include_str!("../../shaders/quant/q8_0.wgsl"),
    k_scales: false,
    own_load32: true,
    decoder_size: DecoderSize::Small,
};

/// 144-byte blocks, whole 16-byte pieces: stored as they are.
const Q4K: GpuQuant = GpuQuant {
    moved_fields: &[],
    decoder: include_str!("../../shaders/quant/q4_k.wgsl"),
    k_scales: true,
    own_load32: true,
    decoder_size: DecoderSize::Medium,
};

/// 176-byte blocks, whole 16-byte pieces: stored as they are.
const Q5K: GpuQuant = GpuQuant {
    moved_fields: &[],
    decoder: include_str!("../../shaders/quant/q5_k.wgsl"),
    k_scales: true,
    own_load32: false,
    decoder_size: DecoderSize::Large,
};

/// 210-byte blocks: the f16 super-block scale at the end moves out, leaving 208 bytes.
const Q6K: GpuQuant = GpuQuant {
    moved_fields: &[Field { at: 208, len: 2 }],
    decoder: include_str!("../../shaders/quant/q6_k.wgsl"),
    k_scales: false,
    own_load32: true,
    decoder_size: DecoderSize::Medium,
};

impl QuantType {
    /// This type's GPU facts.
    pub(crate) fn gpu(self) -> &'static GpuQuant {
        match self {
            QuantType::F32 => &F32,
            QuantType::F16 => &F16,
            QuantType::BF16 => &BF16,
            QuantType::Q4_0 => &Q4_0,
            QuantType::Q4_1 => &Q4_1,
            QuantType::Q5_0 => &Q5_0,
            QuantType::Q5_1 => &Q5_1,
            QuantType::Q8_0 => &Q8_0,
            QuantType::Q4K => &Q4K,
            QuantType::Q5K => &Q5K,
            QuantType::Q6K => &Q6K,
        }
    }
}

/// The WGSL parts that give a kernel `decode8()` and `load32()` for `quant` weights in the
/// upload's layout: the shared interface, the K-quant scale helpers where the decoder uses
/// them, the decoder, and `block32.wgsl` where it has no `load32()` of its own. A kernel
/// appends its own family file after them.
pub(crate) fn decoder_parts(quant: QuantType) -> Vec<&'static str> {
    const COMMON: &str = include_str!("../../shaders/quant/common.wgsl");
    const K_SCALES: &str = include_str!("../../shaders/quant/k_scales.wgsl");
    const BLOCK32: &str = include_str!("../../shaders/quant/block32.wgsl");
    let gpu = quant.gpu();
    let mut parts = vec![COMMON];
    if gpu.k_scales {
        parts.push(K_SCALES);
    }
    parts.push(gpu.decoder);
    if !gpu.own_load32 {
        parts.push(BLOCK32);
    }
    parts
}
