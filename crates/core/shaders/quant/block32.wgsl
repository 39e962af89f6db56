// Block32 for decoders whose decode8 reads each word once (see common.wgsl): weights k .. k + 31
// as four decode8 calls.

struct Block32 {
    w0: Weights8,
    w1: Weights8,
    w2: Weights8,
    w3: Weights8,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    return Block32(decode8(row, k), decode8(row, k + 8u), decode8(row, k + 16u), decode8(row, k + 24u));
}

fn unpack8(block: Block32, i: u32) -> Weights8 {
    switch i {
        case 0u: { return block.w0; }
        case 1u: { return block.w1; }
        case 2u: { return block.w2; }
        default: { return block.w3; }
    }
}
