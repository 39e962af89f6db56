// The interface every block decoder in shaders/quant/ implements, and the helpers they share.
//
// A kernel that reads weights is composed at pipeline creation from three parts: this file,
// ONE decoder (f32.wgsl, q4_k.wgsl, ...) and the kernel family's file. This file declares
// `weights`, @binding(0) of @group(0), holding one chunk of a weight matrix in flint's GPU
// layout (crates/core/src/gpu/weight.rs):
// every row starts on a 16-byte boundary and is `row_words` words long (a multiple of 4), so
// a decoder reads whole 16-byte pieces of a row with one vec4 load where its layout allows
// (one load instead of four: on a GPU one wide transaction, on a CPU device one trip through
// the per-lane load loop instead of four), and single words with word(). Types whose GGUF
// block is a whole number of words and needs no reordering (f32, f16, bf16, q5_1, q4_k, q5_k)
// keep the GGUF bytes as they are; the others (q4_0, q5_0, q8_0, q6_k: 18, 22, 34, 210 bytes,
// and q4_1, whose 16 bytes of nibbles sit one word off a 16-byte boundary) store a row as the
// blocks without their f16 scale (q4_1: its f16 pair), back to back, followed by the row's
// scales (two per word; q4_1: one pair per word).
//
// Every decoder defines
//     fn decode8(row: WeightRow, k: u32) -> Weights8
// returning weights k .. k + 7 of the row (k a multiple of 8 and below the row's length), and
// never reads outside the row; and, for kernels that walk a row 32 weights at a time,
//     struct Block32
//     fn load32(row: WeightRow, k: u32) -> Block32
//     fn unpack8(block: Block32, i: u32) -> Weights8
// where load32 reads what weights k .. k + 31 need (k a multiple of 32), each word once, and
// unpack8 gives weights k + 8i .. k + 8i + 7 (i < 4) from it. Calling decode8 four times reads
// a block's scale word four times and, for 4-bit types, each word of nibbles twice: on a CPU
// device, where every load is a loop over the SIMD lanes, loads set the speed. Types whose
// decode8 reads each word once get load32 from block32.wgsl, made of four decode8 calls.

// The chunk is a storage buffer, or with TEXTURE_WEIGHTS (on CPU devices, whose storage-buffer
// loads are slow) an rgba32uint texture TEXTURE_WIDTH texels wide holding the same words, four
// a texel, row after row. Kernels built with TEXTURE_WEIGHTS read their parameters from a
// storage buffer, not a uniform: lavapipe would otherwise compile the uniform values into a
// new shader variant each time a bind group with the texture is bound (~4 ms).
#if TEXTURE_WEIGHTS
@group(0) @binding(0) var weights: texture_storage_2d<rgba32uint, read>;

// The 16 bytes of the bound chunk from word i on (i a multiple of 4): one texel load.
fn words4(i: u32) -> vec4<u32> {
    let texel = i / 4u;
    return textureLoad(weights, vec2<u32>(texel % TEXTURE_WIDTH, texel / TEXTURE_WIDTH));
}

// Word i of the bound chunk.
fn word(i: u32) -> u32 {
    return words4(i & ~3u)[i % 4u];
}
#else
@group(0) @binding(0) var<storage, read> weights: array<vec4<u32>>;

// Word i of the bound chunk (a single 32-bit load).
fn word(i: u32) -> u32 {
    return weights[i / 4u][i % 4u];
}

// The 16 bytes of the bound chunk from word i on (i a multiple of 4): one vec4 load.
fn words4(i: u32) -> vec4<u32> {
    return weights[i / 4u];
}
#endif

// Eight consecutive weights of a row: elements k .. k + 3 and k + 4 .. k + 7.
struct Weights8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// A row of the bound weights: the index of its first word and its number of GGUF blocks.
struct WeightRow {
    first_word: u32,
    blocks: u32,
}

// The same bit field of each of the four bytes of `packed`, lowest byte first: the bits of
// `mask` shifted to bit `first` of byte i, that is (packed >> (first + 8i)) & mask for i = 0..3.
fn byte_fields(packed: u32, first: u32, mask: u32) -> vec4<u32> {
    return (vec4<u32>(packed) >> (vec4<u32>(0u, 8u, 16u, 24u) + first)) & vec4<u32>(mask);
}

// The f16 scale of block `block` from a row's trailing scale words (two f16 per word).
fn trailing_scale(row: WeightRow, body_words: u32, block: u32) -> f32 {
    let scales = word(row.first_word + row.blocks * body_words + block / 2u);
    return unpack2x16float(scales)[block % 2u];
}
