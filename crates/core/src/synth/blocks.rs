//! Random tensor data: quantized blocks written directly, their fields drawn so that the
//! weights they decode to have mean ~0 and a chosen standard deviation, with no f32 weights in
//! between (an 8B model's would be 32 GB).

use std::io::Write;

use half::f16;

use crate::quant::QuantType;

/// A small deterministic generator (SplitMix64): the same seed gives the same file on every
/// platform and with every version of the `rand` crate.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[-1, 1)`.
    fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Bytes of `n` weights of type `quant` (`n` a multiple of its block size).
pub(crate) fn tensor_bytes(quant: QuantType, n: usize) -> usize {
    n / quant.block_elements() * quant.block_bytes()
}

/// Writes `n` random weights of type `quant` with standard deviation `sigma` and mean ~0 (for
/// F32, mean `mean`: norm weights are ~1), a block row at a time.
pub(crate) fn write_random(
    quant: QuantType,
    n: usize,
    mean: f32,
    sigma: f32,
    rng: &mut SplitMix,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    // Uniform values of half-width a have standard deviation a / sqrt(3).
    let half_width = sigma * 3f32.sqrt();
    let block_bytes = quant.block_bytes();
    let mut block = vec![0u8; block_bytes];
    let mut chunk = Vec::with_capacity(1 << 16);
    for _ in 0..n / quant.block_elements() {
        match quant {
            QuantType::F32 => block.copy_from_slice(&(mean + half_width * rng.signed_unit()).to_le_bytes()),
            QuantType::F16 => {
                block.copy_from_slice(&f16::from_f32(half_width * rng.signed_unit()).to_le_bytes())
            }
            QuantType::Q8_0 => {
                // d * q, q uniform in [-127, 127].
                rng.fill(&mut block[2..]);
                for q in &mut block[2..] {
                    *q = (*q as i8).max(-127) as u8;
                }
                put_f16(&mut block[0..2], half_width / 127.0);
            }
            QuantType::Q4_0 => {
                // d * (q - 8), q uniform in 0..16: standard deviation d * 4.61.
                rng.fill(&mut block[2..]);
                put_f16(&mut block[0..2], sigma / 4.61);
            }
            QuantType::Q5_0 => {
                // d * (q - 16), q uniform in 0..32: standard deviation d * 9.23.
                rng.fill(&mut block[2..]);
                put_f16(&mut block[0..2], sigma / 9.23);
            }
            QuantType::Q4K => q4_k_block(&mut block, sigma, rng),
            QuantType::Q6K => {
                // ql, qh, then 16 scales, then d: d * scale * (q - 32), q uniform in 0..64
                // (standard deviation 18.5), scales in 64..128 (mean 96).
                rng.fill(&mut block[..192]);
                for scale in &mut block[192..208] {
                    *scale = 64 + rng.below(64) as u8;
                }
                put_f16(&mut block[208..210], sigma / (96.0 * 18.5));
            }
            other => unreachable!("no random blocks of {other:?}: the mixes do not use it"),
        }
        chunk.extend_from_slice(&block);
        if chunk.len() >= 1 << 16 {
            out.write_all(&chunk)?;
            chunk.clear();
        }
    }
    out.write_all(&chunk)
}

/// A Q4_K block: d, dmin, 8 six-bit (scale, min) pairs packed into 12 bytes, 256 four-bit
/// values. A weight is `d * scale * q - dmin * min`; with `dmin = 7.5 d` and `min = scale`
/// that is `d * scale * (q - 7.5)`, mean 0, standard deviation `d * scale * 4.61`.
fn q4_k_block(block: &mut [u8], sigma: f32, rng: &mut SplitMix) {
    let scales: [u8; 8] = std::array::from_fn(|_| 32 + rng.below(32) as u8);
    let d = sigma / (48.0 * 4.61);
    put_f16(&mut block[0..2], d);
    put_f16(&mut block[2..4], 7.5 * d);
    let packed = &mut block[4..16];
    for j in 0..4 {
        packed[j] = (scales[j] & 63) | ((scales[j + 4] >> 4) << 6);
        packed[j + 4] = (scales[j] & 63) | ((scales[j + 4] >> 4) << 6);
        packed[j + 8] = (scales[j + 4] & 0xF) | ((scales[j + 4] & 0xF) << 4);
    }
    rng.fill(&mut block[16..]);
}

fn put_f16(bytes: &mut [u8], value: f32) {
    bytes.copy_from_slice(&f16::from_f32(value).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    #[test]
    fn random_blocks_decode_to_weights_of_the_asked_scale() {
        let n = 256 * 64;
        for quant in [
            QuantType::F16,
            QuantType::Q8_0,
            QuantType::Q4_0,
            QuantType::Q5_0,
            QuantType::Q4K,
            QuantType::Q6K,
        ] {
            let mut bytes = Vec::new();
            write_random(quant, n, 0.0, 0.02, &mut SplitMix::new(7), &mut bytes).unwrap();
            assert_eq!(bytes.len(), tensor_bytes(quant, n), "{quant:?}");
            let mut weights = vec![f32::NAN; n];
            dequantize_row(quant, &bytes, &mut weights).unwrap();
            let mean = weights.iter().map(|&w| f64::from(w)).sum::<f64>() / n as f64;
            let std = (weights.iter().map(|&w| (f64::from(w) - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            // Q4_0's codes 0..16 around 8 lean by half a step: a mean of -0.11 sigma.
            assert!(mean.abs() < 0.003, "{quant:?}: mean {mean}");
            assert!((0.016..0.024).contains(&std), "{quant:?}: standard deviation {std}");
        }
        let mut norms = Vec::new();
        write_random(QuantType::F32, 1000, 1.0, 0.05, &mut SplitMix::new(1), &mut norms).unwrap();
        let norms: Vec<f32> = bytemuck::pod_collect_to_vec(&norms);
        assert!(norms.iter().all(|w| (0.9..1.1).contains(w)), "{norms:?}");
    }
}
