//! Lossless re-encoding of small symmetric 32-weight blocks as Q8_0, so that projections of
//! one input quantized with different types can still be stacked into one product.
//!
//! A Q4_0 or Q5_0 weight is `d * (q - offset)` with `q - offset` in -8..8 or -16..16: the same
//! f16 `d` with the same integer as an i8 is a Q8_0 weight of exactly the same value.

use crate::quant::QuantType;

/// `bytes` (whole blocks of `quant`) re-encoded as Q8_0 blocks of the same values, or `None`
/// when `quant` has no exact Q8_0 form (only Q4_0 and Q5_0 do) or `bytes` is not whole blocks.
pub(crate) fn widen_to_q8_0(quant: QuantType, bytes: &[u8]) -> Option<Vec<u8>> {
    let (offset, quants_at) = match quant {
        QuantType::Q4_0 => (8, 2),
        QuantType::Q5_0 => (16, 6),
        _ => return None,
    };
    if !bytes.len().is_multiple_of(quant.block_bytes()) {
        return None;
    }
    let blocks = bytes.len() / quant.block_bytes();
    let mut out = Vec::with_capacity(blocks * QuantType::Q8_0.block_bytes());
    for block in bytes.chunks_exact(quant.block_bytes()) {
        // Q5_0's fifth bits; Q4_0 has none.
        let high_bits = match quant {
            QuantType::Q5_0 => u32::from_le_bytes([block[2], block[3], block[4], block[5]]),
            _ => 0,
        };
        let mut values = [0u8; 32];
        for (j, &q) in block[quants_at..quants_at + 16].iter().enumerate() {
            let high0 = ((high_bits >> j) & 1) << 4;
            let high1 = ((high_bits >> (j + 16)) & 1) << 4;
            values[j] = ((u32::from(q & 0xF) | high0) as i32 - offset) as i8 as u8;
            values[j + 16] = ((u32::from(q >> 4) | high1) as i32 - offset) as i8 as u8;
        }
        out.extend_from_slice(&block[..2]);
        out.extend_from_slice(&values);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::Rng;
    use crate::quant::{dequantize_row, random_rows};

    #[test]
    fn widened_blocks_dequantize_to_the_same_weights() {
        let mut rng = Rng::new("widened_blocks");
        for quant in [QuantType::Q4_0, QuantType::Q5_0] {
            let (rows, cols) = (3, 96);
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let widened = widen_to_q8_0(quant, &bytes).unwrap();
            let mut original = vec![0.0f32; rows * cols];
            let mut wide = vec![0.0f32; rows * cols];
            let row_bytes = (quant.row_bytes(cols).unwrap(), QuantType::Q8_0.row_bytes(cols).unwrap());
            for r in 0..rows {
                let out = r * cols..(r + 1) * cols;
                dequantize_row(quant, &bytes[r * row_bytes.0..][..row_bytes.0], &mut original[out.clone()])
                    .unwrap();
                dequantize_row(QuantType::Q8_0, &widened[r * row_bytes.1..][..row_bytes.1], &mut wide[out])
                    .unwrap();
            }
            // Bit for bit: the same scale times the same integer.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&wide), bits(&original), "{quant}");
        }
    }

    #[test]
    fn only_q4_0_and_q5_0_widen_and_only_whole_blocks() {
        assert!(widen_to_q8_0(QuantType::Q4_1, &[0; 20]).is_none());
        assert!(widen_to_q8_0(QuantType::Q8_0, &[0; 34]).is_none());
        assert!(widen_to_q8_0(QuantType::Q5_0, &[0; 23]).is_none());
    }
}
