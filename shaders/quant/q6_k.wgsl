// Decoder for Q6_K (256 weights a block: 128 bytes ql, 64 bytes qh, 16 signed scales, f16 d).
// In half h (128 weights), weight l + 32i (l < 32, i < 4) is
//     ((ql[64h + l + 32(i % 2)] >> 4(i / 2)) & 15 | ((qh[32h + l] >> 2i) & 3) << 4) - 32
// times d * scales[8h + l / 16 + 2i]. GPU layout: per row, each block without d (208 bytes,
// 52 words: ql at word 0, qh at 32, scales at 48), then the row's f16 scales d.
const Q6_K_BODY_WORDS: u32 = 52u;

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 256u;
    let body = row.first_word + block * Q6_K_BODY_WORDS;
    let e = k % 256u;
    let h = e / 128u;
    let i = (e % 128u) / 32u;
    let l = e % 32u;
    let ql = body + (64u * h + 32u * (i % 2u) + l) / 4u;
    let qh = body + 32u + (32u * h + l) / 4u;
    let scale_index = 8u * h + l / 16u + 2u * i;
    let scale_byte = (weights[body + 48u + scale_index / 4u] >> ((scale_index % 4u) * 8u)) & 0xffu;
    let scale = f32(bitcast<i32>(scale_byte << 24u) >> 24u);
    let d = trailing_scale(row, Q6_K_BODY_WORDS, block) * scale;
    let low_shift = (i / 2u) * 4u;
    let lo = byte_fields(weights[ql], low_shift, 0xfu) | (byte_fields(weights[qh], 2u * i, 3u) << vec4<u32>(4u));
    let hi = byte_fields(weights[ql + 1u], low_shift, 0xfu) | (byte_fields(weights[qh + 1u], 2u * i, 3u) << vec4<u32>(4u));
    return Weights8(d * (vec4<f32>(lo) - 32.0), d * (vec4<f32>(hi) - 32.0));
}
