// The 6-bit sub-block scales and mins shared by the Q4_K and Q5_K decoders: 12 bytes starting
// at word 1 of a block (after the f16 pair d, dmin): a block's first four words are one vec4
// load, which gives the pair and every scale.

// Byte `i` of the 12 scale bytes of a block whose first four words are `header` (the f16 pair,
// then the scale bytes in header.y, header.z and header.w).
fn k_scale_byte(header: vec4<u32>, i: u32) -> u32 {
    return (header[1u + i / 4u] >> ((i % 4u) * 8u)) & 0xffu;
}

// (scale, min) of sub-block s of the block whose first four words are `header`: for s < 4 the
// low 6 bits of bytes s and s + 4; otherwise the nibbles of byte s + 4 with the top 2 bits of
// bytes s - 4 and s.
fn k_scale_min(header: vec4<u32>, s: u32) -> vec2<f32> {
    if s < 4u {
        return vec2<f32>(f32(k_scale_byte(header, s) & 63u), f32(k_scale_byte(header, s + 4u) & 63u));
    }
    let packed = k_scale_byte(header, s + 4u);
    let scale = (packed & 0xfu) | ((k_scale_byte(header, s - 4u) >> 6u) << 4u);
    let min = (packed >> 4u) | ((k_scale_byte(header, s) >> 6u) << 4u);
    return vec2<f32>(f32(scale), f32(min));
}
