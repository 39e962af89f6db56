// The most likely tokens of each row of logits, so that sampling reads back a few candidates
// instead of the whole row.
//
// Layout: `logits` holds `params.rows` rows of `params.n` f32. `out` holds, per row,
// OUT_COUNT token ids, then their OUT_COUNT logits (f32 bits), then one more word: the largest
// finite logit the kernel let go of (f32 bits; -inf when it let go of none). Candidates are
// sorted by logit, largest first, ties by smaller id; unused slots have id 0xffffffff and logit
// -inf. Every token whose logit is above the last word is among the candidates: that is what
// lets the sampler tell whether the candidates decide its draw exactly.
// Workgroup: one per row (the grid may be 2-D: row = wg.x + wg.y * num_workgroups.x), WG_SIZE
// invocations. Each lane scans the elements lane, lane + WG_SIZE, ... keeping its LIST best in
// private memory (sorted by insertion; most elements lose at the first comparison) and the
// largest logit it dropped. The WG_SIZE × LIST kept entries are then bitonic-sorted in workgroup
// memory (log2(N)·(log2(N)+1)/2 barriers) and the first OUT_COUNT written; the entries past
// them count as let go of.
// Bounds: any n >= 1; WG_SIZE × LIST a power of two; OUT_COUNT <= WG_SIZE × LIST. NaN and ±inf
// logits are never candidates (the sampler never draws them).

struct Params {
    rows: u32,
    n: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

const ENTRIES: u32 = WG_SIZE * LIST;
const NO_TOKEN: u32 = 0xffffffffu;
const NEG_INF_BITS: u32 = 0xff800000u;

var<workgroup> entry_logit: array<f32, ENTRIES>;
var<workgroup> entry_id: array<u32, ENTRIES>;
var<workgroup> dropped: array<f32, WG_SIZE>;

// True when (a, ia) comes before (b, ib): larger logit first, then smaller id.
fn before(a: f32, ia: u32, b: f32, ib: u32) -> bool {
    return a > b || (a == b && ia < ib);
}

fn is_finite(v: f32) -> bool {
    return abs(v) <= 3.4028234663852886e38;
}

@compute @workgroup_size(WG_SIZE)
fn top_candidates(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let row = wg.x + wg.y * groups.x;
    // Rows past the end still take part in the barriers below; they write nothing.
    let has_row = row < params.rows;
    // Through a variable: a constant -inf is a shader-creation error in WGSL (Tint rejects
    // `bitcast<f32>(NEG_INF_BITS)` as a const-expression; naga lets it through).
    var neg_inf_bits = NEG_INF_BITS;
    let neg_inf = bitcast<f32>(neg_inf_bits);

    var best_logit: array<f32, LIST>;
    var best_id: array<u32, LIST>;
    for (var i = 0u; i < LIST; i++) {
        best_logit[i] = neg_inf;
        best_id[i] = NO_TOKEN;
    }
    var kept = 0u;
    var let_go = neg_inf;
    if has_row {
        let first = row * params.n;
        for (var j = lane; j < params.n; j += WG_SIZE) {
            let v = logits[first + j];
            if !is_finite(v) {
                continue;
            }
            if kept == LIST && !before(v, j, best_logit[LIST - 1u], best_id[LIST - 1u]) {
                let_go = max(let_go, v);
                continue;
            }
            if kept == LIST {
                let_go = max(let_go, best_logit[LIST - 1u]);
            } else {
                kept += 1u;
            }
            // Insertion: shift the worse entries down one place.
            var at = kept - 1u;
            while at > 0u && before(v, j, best_logit[at - 1u], best_id[at - 1u]) {
                best_logit[at] = best_logit[at - 1u];
                best_id[at] = best_id[at - 1u];
                at -= 1u;
            }
            best_logit[at] = v;
            best_id[at] = j;
        }
    }
    for (var i = 0u; i < LIST; i++) {
        entry_logit[lane * LIST + i] = best_logit[i];
        entry_id[lane * LIST + i] = best_id[i];
    }
    dropped[lane] = let_go;
    workgroupBarrier();

    // Bitonic sort of the ENTRIES entries, into the order of `before`.
    for (var size = 2u; size <= ENTRIES; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var t = lane; t < ENTRIES / 2u; t += WG_SIZE) {
                let i = (t / stride) * 2u * stride + t % stride;
                let k = i + stride;
                // Runs of `size` alternate direction until the last merge, which is all forward.
                let forward = (i & size) == 0u;
                let a = entry_logit[i];
                let ia = entry_id[i];
                let b = entry_logit[k];
                let ib = entry_id[k];
                if before(b, ib, a, ia) == forward {
                    entry_logit[i] = b;
                    entry_id[i] = ib;
                    entry_logit[k] = a;
                    entry_id[k] = ia;
                }
            }
            workgroupBarrier();
        }
    }

    if !has_row {
        return;
    }
    let base = row * (2u * OUT_COUNT + 1u);
    for (var i = lane; i < OUT_COUNT; i += WG_SIZE) {
        out[base + i] = entry_id[i];
        out[base + OUT_COUNT + i] = bitcast<u32>(entry_logit[i]);
    }
    if lane == 0u {
        // Kept entries past OUT_COUNT are let go of too; the first of them is the largest.
        var largest = select(neg_inf, entry_logit[min(OUT_COUNT, ENTRIES - 1u)], OUT_COUNT < ENTRIES);
        for (var l = 0u; l < WG_SIZE; l++) {
            largest = max(largest, dropped[l]);
        }
        out[base + 2u * OUT_COUNT] = bitcast<u32>(largest);
    }
}
