// Decoder for Q4_K (256 weights a block, GGUF layout unchanged, 36 words: f16 d and dmin, 12
// bytes of 6-bit sub-block scales and mins, 128 bytes of nibbles). Sub-block s (32 weights) has
// weight = d * scale_s * q - dmin * min_s; sub-blocks 2p and 2p + 1 share bytes 32p .. 32p + 32
// of qs, low nibbles then high nibbles.
const Q4_K_BLOCK_WORDS: u32 = 36u;

// k_scale_min comes from k_scales.wgsl.
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = row.first_word + (k / 256u) * Q4_K_BLOCK_WORDS;
    let sub = (k % 256u) / 32u;
    let header = words4(block);
    let d_dmin = unpack2x16float(header.x);
    let scale_min = k_scale_min(header, sub);
    let d = d_dmin.x * scale_min.x;
    let m = d_dmin.y * scale_min.y;
    let w = block + 4u + (sub / 2u) * 8u + (k % 32u) / 4u;
    let shift = (sub % 2u) * 4u;
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu));
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu));
    return Weights8(d * lo - m, d * hi - m);
}

// One sub-block of 32 weights: its scale and offset, and the 32 bytes of nibbles it shares with
// its neighbour (it takes the low or the high nibbles).
struct Block32 {
    d: f32,
    m: f32,
    first: vec4<u32>,
    last: vec4<u32>,
    shift: u32,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = row.first_word + (k / 256u) * Q4_K_BLOCK_WORDS;
    let sub = (k % 256u) / 32u;
    let header = words4(block);
    let d_dmin = unpack2x16float(header.x);
    let scale_min = k_scale_min(header, sub);
    let w = block + 4u + (sub / 2u) * 8u;
    return Block32(d_dmin.x * scale_min.x, d_dmin.y * scale_min.y, words4(w), words4(w + 4u), (sub % 2u) * 4u);
}

fn unpack8(block: Block32, i: u32) -> Weights8 {
    let words = select(block.last, block.first, i < 2u);
    let at = 2u * (i % 2u);
    let lo = vec4<f32>(byte_fields(words[at], block.shift, 0xfu));
    let hi = vec4<f32>(byte_fields(words[at + 1u], block.shift, 0xfu));
    return Weights8(block.d * lo - block.m, block.d * hi - block.m);
}
