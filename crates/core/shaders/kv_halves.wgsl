// The KV cache's words: f16 keys and values, two to a u32 (pack2x16float: the lower dim in the
// low half), one vec4 of dims as a vec2<u32>. Composed before the kernels that read or write the
// cache (attention.wgsl's, kv_store.wgsl).

// Four dims as the cache stores them, and back.
fn pack_halves(x: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}

fn unpack_halves(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// `x` rounded to what the cache keeps of it: a new key or value used straight from registers
// gets the same value as when read back from the cache.
fn as_cached(x: vec4<f32>) -> vec4<f32> {
    return unpack_halves(pack_halves(x));
}
