//! GGML tensor types: block geometry and CPU dequantization.
//!
//! A quantized row of `n` weights is `n / block_elements` blocks of `block_bytes` each, stored
//! back to back exactly as in the GGUF file (and, unchanged, in GPU memory).

mod dequant;
mod widen;

pub use dequant::dequantize_row;
#[cfg(any(test, feature = "kernel-timing"))]
pub(crate) use dequant::random_rows;
pub(crate) use widen::widen_to_q8_0;

/// The GGML tensor types flint reads, with their GGML type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum QuantType {
    /// 32-bit float.
    F32,
    /// IEEE half float.
    F16,
    /// bfloat16.
    BF16,
    /// 32 weights: f16 scale, 16 bytes of 4-bit quants (offset 8).
    Q4_0,
    /// 32 weights: f16 scale and min, 16 bytes of 4-bit quants.
    Q4_1,
    /// 32 weights: f16 scale, 4 bytes of high bits, 16 bytes of low nibbles (offset 16).
    Q5_0,
    /// 32 weights: f16 scale and min, 4 bytes of high bits, 16 bytes of low nibbles.
    Q5_1,
    /// 32 weights: f16 scale, 32 signed bytes.
    Q8_0,
    /// 256 weights: f16 super-scale and super-min, 12 bytes of 6-bit sub-scales/mins, 128 bytes of nibbles.
    Q4K,
    /// 256 weights: as Q4_K plus 32 bytes of high bits.
    Q5K,
    /// 256 weights: 128 bytes low nibbles, 64 bytes high 2 bits, 16 signed sub-scales, f16 scale.
    Q6K,
}

impl QuantType {
    /// Every type flint reads.
    pub const ALL: [QuantType; 11] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
    ];

    /// The type for a GGML type id, or `None` if flint does not read it.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => QuantType::F32,
            1 => QuantType::F16,
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            6 => QuantType::Q5_0,
            7 => QuantType::Q5_1,
            8 => QuantType::Q8_0,
            12 => QuantType::Q4K,
            13 => QuantType::Q5K,
            14 => QuantType::Q6K,
            30 => QuantType::BF16,
            _ => return None,
        })
    }

    /// The type's GGML type id (what [`QuantType::from_ggml_id`] reads).
    pub fn ggml_id(self) -> u32 {
        match self {
            QuantType::F32 => 0,
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q4K => 12,
            QuantType::Q5K => 13,
            QuantType::Q6K => 14,
            QuantType::BF16 => 30,
        }
    }

    /// The GGML name of a type id, known or not (for error messages).
    pub fn ggml_name(id: u32) -> &'static str {
        const NAMES: [&str; 40] = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
        ];
        NAMES.get(id as usize).copied().unwrap_or("unknown")
    }

    /// The name GGML uses for this type.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "F32",
            QuantType::F16 => "F16",
            QuantType::BF16 => "BF16",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
        }
    }

    /// Weights per block.
    pub fn block_elements(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0 => 32,
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
        }
    }

    /// Bytes of a row of `elements` weights, or `None` when `elements` is not a whole number
    /// of blocks or the size does not fit a `usize`.
    pub fn row_bytes(self, elements: usize) -> Option<usize> {
        let block = self.block_elements();
        if !elements.is_multiple_of(block) {
            return None;
        }
        // Row lengths come from files: a hostile one must not overflow.
        (elements / block).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod row_bytes_tests {
    use super::QuantType;

    #[test]
    fn row_bytes_rejects_partial_blocks_and_overflow() {
        assert_eq!(QuantType::Q4K.row_bytes(512), Some(288));
        assert_eq!(QuantType::Q8_0.row_bytes(576), Some(612));
        assert_eq!(QuantType::Q4K.row_bytes(300), None);
        assert_eq!(QuantType::F32.row_bytes(usize::MAX / 2), None);
        assert_eq!(QuantType::F16.row_bytes(usize::MAX / 2 + 1), None);
        assert_eq!(QuantType::Q6K.row_bytes(usize::MAX / 256 * 256), Some(usize::MAX / 256 * 210));
    }

    #[test]
    fn ggml_ids_round_trip() {
        for quant in QuantType::ALL {
            assert_eq!(QuantType::from_ggml_id(quant.ggml_id()), Some(quant));
        }
    }
}
