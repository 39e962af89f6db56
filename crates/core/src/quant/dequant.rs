//! CPU dequantization of GGML blocks (the reference the GPU kernels are tested against).
//!
//! Each function mirrors ggml's `dequantize_row_*` (ggml-quants.c) for one block: the same
//! bit layout and the same f32 arithmetic, so results agree with llama.cpp's to the last bit
//! or within one rounding of the scale products.

use half::{bf16, f16};

use crate::quant::QuantType;
use crate::{Error, Result};

/// Dequantizes one row: `bytes` holds whole blocks of `quant` (exactly as stored in a GGUF
/// file), `out` receives their `out.len()` weights.
///
/// Fails when `out.len()` is not a whole number of blocks or `bytes` is not
/// `quant.row_bytes(out.len())` long.
pub fn dequantize_row(quant: QuantType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let expected = quant.row_bytes(out.len()).ok_or_else(|| Error::KernelArguments {
        kernel: "dequantize_row",
        reason: format!(
            "{} weights is not a whole number of {quant} blocks ({} weights each)",
            out.len(),
            quant.block_elements()
        ),
    })?;
    if bytes.len() != expected {
        return Err(Error::KernelArguments {
            kernel: "dequantize_row",
            reason: format!(
                "a {quant} row of {} weights is {expected} bytes, but {} bytes were given",
                out.len(),
                bytes.len()
            ),
        });
    }
    let decode: fn(&[u8], &mut [f32]) = match quant {
        QuantType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        QuantType::F16 => |b, y| y[0] = half_at(b, 0),
        QuantType::BF16 => |b, y| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        QuantType::Q4_0 => q4_0,
        QuantType::Q4_1 => q4_1,
        QuantType::Q5_0 => q5_0,
        QuantType::Q5_1 => q5_1,
        QuantType::Q8_0 => q8_0,
        QuantType::Q4K => q4_k,
        QuantType::Q5K => q5_k,
        QuantType::Q6K => q6_k,
    };
    for (block, weights) in
        bytes.chunks_exact(quant.block_bytes()).zip(out.chunks_exact_mut(quant.block_elements()))
    {
        decode(block, weights);
    }
    Ok(())
}

/// The little-endian f16 at byte `at`, widened to f32.
fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Q4_0: `d: f16, qs: [u8; 16]`; weight j is `(qs[j] & 15) - 8` and weight j + 16 is
/// `(qs[j] >> 4) - 8`, times d.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1: `d: f16, m: f16, qs: [u8; 16]`; nibbles as Q4_0, unsigned, times d plus m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = (q & 0xF) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// Q5_0: `d: f16, qh: u32, qs: [u8; 16]`; bit j of qh is the fifth bit of weight j; values
/// are offset by 16.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..22].iter().enumerate() {
        let high0 = ((qh >> j) << 4) & 0x10;
        let high1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((u32::from(q & 0xF) | high0) as i32 - 16) as f32 * d;
        y[j + 16] = ((u32::from(q >> 4) | high1) as i32 - 16) as f32 * d;
    }
}

/// Q5_1: `d: f16, m: f16, qh: u32, qs: [u8; 16]`; as Q5_0, unsigned, times d plus m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..24].iter().enumerate() {
        let high0 = ((qh >> j) << 4) & 0x10;
        let high1 = (qh >> (j + 12)) & 0x10;
        y[j] = (u32::from(q & 0xF) | high0) as f32 * d + m;
        y[j + 16] = (u32::from(q >> 4) | high1) as f32 * d + m;
    }
}

/// Q8_0: `d: f16, qs: [i8; 32]`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (out, &q) in y.iter_mut().zip(&b[2..34]) {
        *out = f32::from(q as i8) * d;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block, packed in 12
/// bytes: sub-blocks 0..4 in the low 6 bits of bytes 0..4 (scales) and 4..8 (mins);
/// sub-blocks 4..8 in the nibbles of bytes 8..12 plus the top 2 bits of bytes 0..8.
fn k_scale_min(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// Q4_K: `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`: 8 sub-blocks of 32; each 32
/// bytes of qs hold two sub-blocks (low nibbles, then high nibbles); weight = d·sc·q − dmin·m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    for (pair, (qs, y)) in b[16..144].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc0, m0) = k_scale_min(2 * pair, scales);
        let (sc1, m1) = k_scale_min(2 * pair + 1, scales);
        let (d0, min0) = (d * f32::from(sc0), dmin * f32::from(m0));
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        for (l, &q) in qs.iter().enumerate() {
            y[l] = d0 * f32::from(q & 0xF) - min0;
            y[l + 32] = d1 * f32::from(q >> 4) - min1;
        }
    }
}

/// Q5_K: `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`: as Q4_K with a
/// fifth bit per weight; bit 2p (2p + 1) of qh[l] belongs to weight l of sub-block 2p (2p + 1).
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (pair, (qs, y)) in b[48..176].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc0, m0) = k_scale_min(2 * pair, scales);
        let (sc1, m1) = k_scale_min(2 * pair + 1, scales);
        let (d0, min0) = (d * f32::from(sc0), dmin * f32::from(m0));
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        for (l, &q) in qs.iter().enumerate() {
            let high0 = ((qh[l] >> (2 * pair)) & 1) << 4;
            let high1 = ((qh[l] >> (2 * pair + 1)) & 1) << 4;
            y[l] = d0 * f32::from((q & 0xF) | high0) - min0;
            y[l + 32] = d1 * f32::from((q >> 4) | high1) - min1;
        }
    }
}

/// Q6_K: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`: two halves of 128 weights;
/// in each, weight l + 32i (i in 0..4) takes a nibble of ql and 2 bits of qh, offset by 32,
/// times d and the signed scale of its 16 weights.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            let scale = |i: usize| d * f32::from(sc[is + i] as i8);
            y[l] = scale(0) * q1 as f32;
            y[l + 32] = scale(2) * q2 as f32;
            y[l + 64] = scale(4) * q3 as f32;
            y[l + 96] = scale(6) * q4 as f32;
        }
    }
}

/// Rows of random blocks for GPU tests: random bytes with every f16 scale (and every f16 / bf16
/// / f32 weight) replaced by a finite value, so no NaN or Inf reaches a comparison.
#[cfg(any(test, feature = "kernel-timing"))]
pub(crate) fn random_rows(
    quant: QuantType,
    rows: usize,
    cols: usize,
    rng: &mut crate::kernels::testing::Rng,
) -> Vec<u8> {
    let row_bytes = quant.row_bytes(cols).expect("cols is a whole number of blocks");
    let mut bytes = rng.bytes(rows * row_bytes);
    let finite_f16 = |rng: &mut crate::kernels::testing::Rng, lo: f32, hi: f32| {
        f16::from_f32(rng.f32(lo, hi)).to_le_bytes()
    };
    // Byte offsets of the f16 scales inside one block.
    let scale_offsets: &[usize] = match quant {
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => &[],
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => &[0],
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q6K => &[208],
    };
    for block in bytes.chunks_exact_mut(quant.block_bytes()) {
        match quant {
            QuantType::F32 => block.copy_from_slice(&rng.f32(-2.0, 2.0).to_le_bytes()),
            QuantType::F16 => block.copy_from_slice(&finite_f16(rng, -2.0, 2.0)),
            QuantType::BF16 => block.copy_from_slice(&bf16::from_f32(rng.f32(-2.0, 2.0)).to_le_bytes()),
            _ => {
                for &at in scale_offsets {
                    block[at..at + 2].copy_from_slice(&finite_f16(rng, -0.05, 0.05));
                }
            }
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dequantize(quant: QuantType, bytes: &[u8], n: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; n];
        dequantize_row(quant, bytes, &mut out).unwrap();
        out
    }

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    /// Quant values 0..levels with a fixed, irregular pattern so neighbours differ.
    fn levels(n: usize, levels: u32, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| (i * 7 + salt * 13 + i * i / 3) % levels).collect()
    }

    /// The 12 scale bytes of a Q4_K / Q5_K block, packed as ggml's quantizer packs them.
    fn pack_k_scales(sc: &[u32; 8], m: &[u32; 8]) -> [u8; 12] {
        let mut out = [0u8; 12];
        for j in 0..8 {
            let (ls, lm) = (sc[j] as u8, m[j] as u8);
            if j < 4 {
                out[j] = ls;
                out[j + 4] = lm;
            } else {
                out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                out[j - 4] |= (ls >> 4) << 6;
                out[j] |= (lm >> 4) << 6;
            }
        }
        out
    }

    #[test]
    fn float_types() {
        let values = [1.5f32, -0.25, 3.0e-3, 65504.0];
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(dequantize(QuantType::F32, &f32_bytes, 4), values);
        let f16_bytes: Vec<u8> = values.iter().flat_map(|&v| h(v)).collect();
        let expected: Vec<f32> = values.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!(dequantize(QuantType::F16, &f16_bytes, 4), expected);
        // bf16 is the high half of an f32.
        let bf16_bytes: Vec<u8> =
            values.iter().flat_map(|v| v.to_bits().to_le_bytes()[2..].to_vec()).collect();
        let expected: Vec<f32> = values.iter().map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000)).collect();
        assert_eq!(dequantize(QuantType::BF16, &bf16_bytes, 4), expected);
    }

    #[test]
    fn q4_0_and_q4_1() {
        let q = levels(64, 16, 1);
        for quant in [QuantType::Q4_0, QuantType::Q4_1] {
            let mut bytes = Vec::new();
            for (blk, q) in q.chunks(32).enumerate() {
                bytes.extend(h(0.5 + blk as f32));
                if quant == QuantType::Q4_1 {
                    bytes.extend(h(-1.25));
                }
                bytes.extend((0..16).map(|j| (q[j] | (q[j + 16] << 4)) as u8));
            }
            let expected: Vec<f32> = (0..64)
                .map(|i| {
                    let d = 0.5 + (i / 32) as f32;
                    match quant {
                        QuantType::Q4_0 => (q[i] as f32 - 8.0) * d,
                        _ => q[i] as f32 * d - 1.25,
                    }
                })
                .collect();
            assert_eq!(dequantize(quant, &bytes, 64), expected, "{quant}");
        }
    }

    #[test]
    fn q5_0_and_q5_1() {
        let q = levels(64, 32, 2);
        for quant in [QuantType::Q5_0, QuantType::Q5_1] {
            let mut bytes = Vec::new();
            for q in q.chunks(32) {
                bytes.extend(h(0.75));
                if quant == QuantType::Q5_1 {
                    bytes.extend(h(2.0));
                }
                let qh: u32 = (0..32).map(|j| (q[j] >> 4) << j).sum();
                bytes.extend(qh.to_le_bytes());
                bytes.extend((0..16).map(|j| ((q[j] & 15) | ((q[j + 16] & 15) << 4)) as u8));
            }
            let expected: Vec<f32> = (0..64)
                .map(|i| match quant {
                    QuantType::Q5_0 => (q[i] as f32 - 16.0) * 0.75,
                    _ => q[i] as f32 * 0.75 + 2.0,
                })
                .collect();
            assert_eq!(dequantize(quant, &bytes, 64), expected, "{quant}");
        }
    }

    #[test]
    fn q8_0() {
        let q: Vec<i8> = (0..64).map(|i| (i * 37 % 256) as u8 as i8).collect();
        let mut bytes = Vec::new();
        for q in q.chunks(32) {
            bytes.extend(h(0.125));
            bytes.extend(q.iter().map(|&v| v as u8));
        }
        let expected: Vec<f32> = q.iter().map(|&v| f32::from(v) * 0.125).collect();
        assert_eq!(dequantize(QuantType::Q8_0, &bytes, 64), expected);
    }

    #[test]
    fn q4_k_and_q5_k() {
        let sc: [u32; 8] = [1, 63, 17, 40, 33, 5, 62, 48];
        let m: [u32; 8] = [60, 2, 31, 47, 16, 63, 9, 36];
        let (d, dmin) = (0.5f32, 0.25f32);
        for quant in [QuantType::Q4K, QuantType::Q5K] {
            let bits = if quant == QuantType::Q4K { 16 } else { 32 };
            let q = levels(256, bits, 3);
            let mut bytes = Vec::new();
            bytes.extend(h(d));
            bytes.extend(h(dmin));
            bytes.extend(pack_k_scales(&sc, &m));
            if quant == QuantType::Q5K {
                let mut qh = [0u8; 32];
                for (i, &v) in q.iter().enumerate() {
                    qh[i % 32] |= ((v >> 4) as u8) << (i / 32);
                }
                bytes.extend(qh);
            }
            for pair in 0..4 {
                bytes.extend(
                    (0..32).map(|l| ((q[64 * pair + l] & 15) | ((q[64 * pair + 32 + l] & 15) << 4)) as u8),
                );
            }
            let expected: Vec<f32> =
                (0..256).map(|i| d * sc[i / 32] as f32 * q[i] as f32 - dmin * m[i / 32] as f32).collect();
            assert_eq!(dequantize(quant, &bytes, 256), expected, "{quant}");
        }
    }

    #[test]
    fn q6_k() {
        let q = levels(256, 64, 4);
        let sc: Vec<i8> = (0..16).map(|i| (i * 23 - 128) as i8).collect();
        let d = 0.0625f32;
        let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
        for half in 0..2 {
            for l in 0..32 {
                let at = |i: usize| q[128 * half + l + 32 * i];
                ql[64 * half + l] = ((at(0) & 15) | ((at(2) & 15) << 4)) as u8;
                ql[64 * half + l + 32] = ((at(1) & 15) | ((at(3) & 15) << 4)) as u8;
                qh[32 * half + l] =
                    ((at(0) >> 4) | ((at(1) >> 4) << 2) | ((at(2) >> 4) << 4) | ((at(3) >> 4) << 6)) as u8;
            }
        }
        let mut bytes = [ql, qh].concat();
        bytes.extend(sc.iter().map(|&s| s as u8));
        bytes.extend(h(d));
        let expected: Vec<f32> = (0..256).map(|i| d * f32::from(sc[i / 16]) * (q[i] as f32 - 32.0)).collect();
        assert_eq!(dequantize(QuantType::Q6K, &bytes, 256), expected);
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let mut out = vec![0.0; 32];
        let err = dequantize_row(QuantType::Q8_0, &[0; 33], &mut out).unwrap_err();
        assert!(err.to_string().contains("34 bytes"), "{err}");
        let mut out = vec![0.0; 100];
        let err = dequantize_row(QuantType::Q4K, &[0; 144], &mut out).unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
    }
}
