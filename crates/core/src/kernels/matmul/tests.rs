use super::*;

/// The kernel source of a product, as `record` compiles it.
fn source(
    variant: Variant,
    quant: QuantType,
    textures: bool,
    input: MatmulInput,
    output: MatmulOutput,
) -> KernelSource {
    Recipe::of(variant, quant, textures, input, output).source()
}
use crate::gpu::{DeviceClass, GpuContext};
use crate::kernels::norm::tests::reference as norm_reference;
use crate::kernels::testing::{POISON, Rng, both_paths, gpu, validate_wgsl};
use crate::quant::{dequantize_row, random_rows};

/// Every variant a test forces: the devices' own choices come on top. TPR 4 and 8 with
/// subgroup shuffles and the activation broadcast fit lavapipe's subgroups of 8. Row tiles
/// of 3 and 8 leave partial tiles on every test shape.
const FORCED: [Variant; 9] = [
    TILED,
    Variant {
        wg_size: 64,
        threads_per_row: 1,
        row_tile: 1,
        batch_tile: 8,
        reduce: Reduce::None,
        x_broadcast: false,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 32,
        threads_per_row: 4,
        row_tile: 1,
        batch_tile: 4,
        reduce: Reduce::Shared,
        x_broadcast: false,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 128,
        threads_per_row: 32,
        row_tile: 1,
        batch_tile: 8,
        reduce: Reduce::Shared,
        x_broadcast: false,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 64,
        threads_per_row: 8,
        row_tile: 1,
        batch_tile: 4,
        reduce: Reduce::Subgroup,
        x_broadcast: false,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 64,
        threads_per_row: 1,
        row_tile: 8,
        batch_tile: 16,
        reduce: Reduce::None,
        x_broadcast: false,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 16,
        threads_per_row: 1,
        row_tile: 3,
        batch_tile: 4,
        reduce: Reduce::None,
        x_broadcast: true,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 64,
        threads_per_row: 1,
        row_tile: 8,
        batch_tile: 16,
        reduce: Reduce::None,
        x_broadcast: true,
        x_window_rows: None,
        tiled: false,
    },
    Variant {
        wg_size: 32,
        threads_per_row: 1,
        row_tile: 2,
        batch_tile: 8,
        reduce: Reduce::None,
        x_broadcast: true,
        x_window_rows: None,
        tiled: false,
    },
];

/// Error bound, relative to the sum of magnitudes `Σ_k |W[r, k] x[b, k]|` of each output
/// (the condition of a dot product: a plain relative error is meaningless for a sum that
/// cancels to near zero). The GPU decodes with the same f32 operations as `dequantize_row`
/// up to fused multiply-adds, so what is left is f32 summation of a few thousand terms,
/// measured below 2e-7 on random data; one wrong weight among n costs about 1 / n, far above.
const TOLERANCE: f64 = 2e-6;

/// Columns for a type: several blocks, not a power of two.
fn test_cols(quant: QuantType) -> usize {
    match quant.block_elements() {
        1 => 8 * 29,
        32 => 32 * 5,
        _ => 256 * 3,
    }
}

/// The f64 product of the dequantized weight with each batch row of x, and each output's
/// sum of magnitudes.
fn reference(quant: QuantType, rows: usize, cols: usize, bytes: &[u8], x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let row_bytes = quant.row_bytes(cols).unwrap();
    let mut w = vec![0.0f32; rows * cols];
    for (r, out) in w.chunks_exact_mut(cols).enumerate() {
        dequantize_row(quant, &bytes[r * row_bytes..(r + 1) * row_bytes], out).unwrap();
    }
    let (mut y, mut magnitude) = (Vec::new(), Vec::new());
    for xb in x.chunks_exact(cols) {
        for wr in w.chunks_exact(cols) {
            let terms = xb.iter().zip(wr).map(|(&a, &w)| f64::from(a) * f64::from(w));
            y.push(terms.clone().sum());
            magnitude.push(terms.map(f64::abs).sum());
        }
    }
    (y, magnitude)
}

/// Asserts every output is within [`TOLERANCE`] of the reference; names the first that is not.
fn assert_dot_close(what: &str, got: &[f32], expected: &[f64], magnitude: &[f64]) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let mut worst = 0.0f64;
    for (i, ((&g, &e), &m)) in got.iter().zip(expected).zip(magnitude).enumerate() {
        let err = (f64::from(g) - e).abs() / m.max(f64::MIN_POSITIVE);
        assert!(
            err <= TOLERANCE,
            "{what}: output {i} of {}: got {g}, expected {e} (error {err:.3e} of the magnitude {m:.3e} > {TOLERANCE:.0e})",
            got.len()
        );
        worst = worst.max(err);
    }
    eprintln!("{what}: worst error {worst:.3e} of the magnitude");
}

/// The forced variants that this device runs, and a twin of each one that broadcasts x reading
/// x through windows of about 3 batch rows (so that 17 rows take several dispatches, the last
/// one partial), where the device's alignment of uniform bindings allows it at `cols`.
fn forced(ctx: &GpuContext, cols: usize) -> Vec<Variant> {
    let runs = |v: &Variant| !((v.reduce == Reduce::Subgroup || v.x_broadcast) && !ctx.features().subgroups);
    let variants: Vec<Variant> = FORCED.into_iter().filter(runs).collect();
    let windowed = variants.iter().filter(|v| v.x_broadcast).filter_map(|v| {
        let rows = uniform_window_rows(ctx, cols, 3 * 4 * cols as u64, 1)?;
        Some(Variant { x_window_rows: Some(rows), ..*v })
    });
    let windowed: Vec<Variant> = windowed.collect();
    assert!(
        !ctx.features().subgroups || ctx.device_class() != DeviceClass::Cpu || !windowed.is_empty(),
        "no windowed variant at {cols} columns"
    );
    variants.into_iter().chain(windowed).collect()
}

/// Runs one product through `variant` (or the device's own choice) and checks it; returns
/// the number of chunks the weight was split into.
#[allow(clippy::too_many_arguments)]
fn check(
    ctx: &GpuContext,
    quant: QuantType,
    rows: usize,
    cols: usize,
    batch: usize,
    max_chunk_bytes: u64,
    variant: Option<Variant>,
    rng: &mut Rng,
) -> usize {
    let bytes = random_rows(quant, rows, cols, rng);
    let x = rng.f32s(batch * cols, -1.0, 1.0);
    let weight = QuantMatrix::upload_in_chunks(ctx, "w", quant, rows, cols, &bytes, max_chunk_bytes).unwrap();
    let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
    let y_gpu = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
    y_gpu.fill_bits(ctx, POISON);
    let mut encoder = ctx.encoder("test");
    run(ctx, &mut encoder, &weight, MatmulInput::Plain(&x_gpu), MatmulOutput::Write(&y_gpu), variant)
        .unwrap();
    ctx.submit(encoder).unwrap();
    let got = pollster::block_on(y_gpu.to_f32(ctx)).unwrap();
    let what = format!("{quant} {rows}x{cols} batch {batch}, {} chunks, {variant:?}", weight.chunk_count());
    let (expected, magnitude) = reference(quant, rows, cols, &bytes, &x);
    assert_dot_close(&what, &got, &expected, &magnitude);
    weight.chunk_count()
}

/// Every type through the devices' own variants and the forced ones, on awkward shapes.
fn matmul_matches_reference(quant: QuantType) {
    let mut rng = Rng::new(&format!("matmul {quant}"));
    let cols = test_cols(quant);
    for (path, ctx) in both_paths() {
        eprintln!("{path}");
        for (rows, batch) in [(1, 1), (7, 3), (67, 17), (259, 1), (259, 5)] {
            check(ctx, quant, rows, cols, batch, u64::MAX, None, &mut rng);
        }
    }
    let ctx = gpu();
    for variant in forced(ctx, cols) {
        // The tiled kernel also over more than one block of 64 x 64.
        let more = variant.tiled.then_some((130, 70));
        for (rows, batch) in [(7, 1), (67, 17)].into_iter().chain(more) {
            check(ctx, quant, rows, cols, batch, u64::MAX, Some(variant), &mut rng);
        }
    }
}

macro_rules! per_type {
    ($($name:ident: $quant:expr,)*) => {$(
        #[test]
        fn $name() {
            matmul_matches_reference($quant);
        }
    )*};
}

per_type! {
    matmul_f32: QuantType::F32,
    matmul_f16: QuantType::F16,
    matmul_bf16: QuantType::BF16,
    matmul_q4_0: QuantType::Q4_0,
    matmul_q4_1: QuantType::Q4_1,
    matmul_q5_0: QuantType::Q5_0,
    matmul_q5_1: QuantType::Q5_1,
    matmul_q8_0: QuantType::Q8_0,
    matmul_q4_k: QuantType::Q4K,
    matmul_q5_k: QuantType::Q5K,
    matmul_q6_k: QuantType::Q6K,
}

/// Uniform windows are the most rows that fit the device's binding with every window's
/// offset aligned, in whole batch tiles wherever one fits (found here by trying every row
/// count): on SmolLM2's and gemma3's row widths, narrow ones, one whose window holds a single
/// row and one too wide for any.
#[test]
fn uniform_windows_hold_whole_tiles() {
    let ctx = gpu();
    let limits = ctx.limits();
    let align = u64::from(limits.min_uniform_buffer_offset_alignment);
    let bytes = UNIFORM_WINDOW_BYTES.min(limits.max_uniform_buffer_binding_size);
    for cols in [8, 56, 576, 640, 1536, 2048, 8200, 20000] {
        let row_bytes = 4 * cols as u64;
        let aligned: Vec<u64> =
            (1..=bytes / row_bytes).filter(|k| (k * row_bytes).is_multiple_of(align)).collect();
        for batch_tile in [1, 3, 4, 8, 16] {
            let whole_tiles = aligned.iter().filter(|&&k| k.is_multiple_of(u64::from(batch_tile))).max();
            let expected = whole_tiles.or(aligned.iter().max()).map(|&k| k as u32);
            let rows = uniform_window_rows(ctx, cols, UNIFORM_WINDOW_BYTES, batch_tile);
            assert_eq!(rows, expected, "{cols} columns, batch tile {batch_tile}");
        }
    }
}

/// Products of RMS-normalised activations, against the norm then the product in f64: both
/// conventions, one output and split outputs, the devices' own variants and the forced ones
/// (whose sums of squares are reduced across invocations like the products).
#[test]
fn normed_input_matches_reference() {
    let mut rng = Rng::new("matmul normed");
    let eps = 1e-5f32;
    // F16 rows end in columns past the last block of 32, which every lane loads whole.
    let mut cases: Vec<(QuantType, &str, &GpuContext, Option<Variant>)> = Vec::new();
    for quant in [QuantType::Q4_1, QuantType::F16] {
        cases.extend(both_paths().into_iter().map(|(path, ctx)| (quant, path, ctx, None)));
        let ctx = gpu();
        cases.extend(forced(ctx, test_cols(quant)).into_iter().map(|v| (quant, "forced", ctx, Some(v))));
    }
    for (quant, path, ctx, variant) in cases {
        let cols = test_cols(quant);
        for (convention, (rows, batch)) in [(NormWeight::Scale, (67, 1)), (NormWeight::OnePlus, (7, 17))] {
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let weight = QuantMatrix::upload_parts(ctx, "w", quant, cols, &[&bytes], u64::MAX).unwrap();
            // Rows of x at different scales: the norm must take each row's own.
            let mut x = rng.f32s(batch * cols, -1.0, 1.0);
            for (b, row) in x.chunks_exact_mut(cols).enumerate() {
                row.iter_mut().for_each(|v| *v *= 0.25 + 3.0 * b as f32);
            }
            let gamma = rng.f32s(cols, -2.0, 2.0);
            let normed = norm_reference(&x, &gamma, convention, eps);
            let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
            let gamma_gpu = Tensor::from_slice(ctx, "gamma", &[cols], &gamma).unwrap();
            let norm = RmsNorm { weight: &gamma_gpu, convention, eps };
            let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
            y.fill_bits(ctx, POISON);
            let mut encoder = ctx.encoder("test");
            run(
                ctx,
                &mut encoder,
                &weight,
                MatmulInput::Normed(&x_gpu, norm),
                MatmulOutput::Write(&y),
                variant,
            )
            .unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(y.to_f32(ctx)).unwrap();
            let (expected, magnitude) = reference(quant, rows, cols, &bytes, &normed);
            let what = format!("{path} normed {convention:?} {rows}x{cols} batch {batch} {variant:?}");
            assert_dot_close(&what, &got, &expected, &magnitude);
        }
        // Split outputs of a stacked weight, through the public function.
        if variant.is_none() {
            let parts: Vec<Vec<u8>> =
                [5usize, 9, 3].iter().map(|&r| random_rows(quant, r, cols, &mut rng)).collect();
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let weight = QuantMatrix::upload_parts(ctx, "w", quant, cols, &slices, u64::MAX).unwrap();
            let x = rng.f32s(2 * cols, -3.0, 3.0);
            let gamma = rng.f32s(cols, -1.0, 1.0);
            let x_gpu = Tensor::from_slice(ctx, "x", &[2, cols], &x).unwrap();
            let gamma_gpu = Tensor::from_slice(ctx, "gamma", &[cols], &gamma).unwrap();
            let norm = RmsNorm { weight: &gamma_gpu, convention: NormWeight::Scale, eps };
            let ys: Vec<Tensor> =
                [5, 9, 3].iter().map(|&r| Tensor::empty(ctx, "y", &[2, r]).unwrap()).collect();
            let mut encoder = ctx.encoder("test");
            let outputs = ys.iter().collect::<Vec<_>>();
            let (input, output) = (MatmulInput::Normed(&x_gpu, norm), MatmulOutput::Split(&outputs));
            matmul(ctx, &mut encoder, &weight, input, output).unwrap();
            ctx.submit(encoder).unwrap();
            let normed = norm_reference(&x, &gamma, NormWeight::Scale, eps);
            for (p, (y, bytes)) in ys.iter().zip(&parts).enumerate() {
                let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                let (expected, magnitude) =
                    reference(quant, bytes.len() / quant.row_bytes(cols).unwrap(), cols, bytes, &normed);
                assert_dot_close(&format!("{path} normed split part {p}"), &got, &expected, &magnitude);
            }
            // A norm weight of the wrong length is refused.
            let short = Tensor::from_slice(ctx, "gamma", &[cols - 8], &gamma[..cols - 8]).unwrap();
            let bad = RmsNorm { weight: &short, convention: NormWeight::Scale, eps };
            let (input, output) = (MatmulInput::Normed(&x_gpu, bad), MatmulOutput::Write(&ys[0]));
            let err = matmul(ctx, &mut ctx.encoder("test"), &weight, input, output).unwrap_err();
            assert!(err.to_string().contains("norm's weight"), "{err}");
        }
    }
}

/// Products of residual inputs (a post-normed sublayer added to the residual, the sum
/// normalised), against the post-norm, the add, the norm and the product in f64, and the sum
/// each stores: both conventions, one output and three split outputs of a weight in several
/// chunks, the devices' own variants and the forced ones.
#[test]
fn residual_input_matches_reference() {
    let mut rng = Rng::new("matmul residual");
    let eps = 1e-6f32;
    // F16 rows end in columns past the last block of 32, loaded apart from the blocks.
    let mut cases: Vec<(QuantType, &str, &GpuContext, Option<Variant>)> = Vec::new();
    for quant in [QuantType::Q8_0, QuantType::F16] {
        cases.extend(both_paths().into_iter().map(|(path, ctx)| (quant, path, ctx, None)));
        let ctx = gpu();
        cases.extend(forced(ctx, test_cols(quant)).into_iter().map(|v| (quant, "forced", ctx, Some(v))));
    }
    for (quant, path, ctx, variant) in cases {
        let cols = test_cols(quant);
        let shapes = [(NormWeight::Scale, 67, 1, false), (NormWeight::OnePlus, 7, 17, false)];
        // Three parts in chunks of about 4 rows (the sum is stored by the first chunk's
        // dispatch), through the public function.
        let split = (NormWeight::Scale, 15, 5, true);
        for (convention, rows, batch, split) in shapes.into_iter().chain(variant.is_none().then_some(split)) {
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let chunk = if split { 4 * quant.row_bytes(cols).unwrap() as u64 } else { u64::MAX };
            let row_bytes = quant.row_bytes(cols).unwrap();
            let part_rows: Vec<usize> = if split { vec![5, 5, rows - 10] } else { vec![rows] };
            let parts: Vec<&[u8]> = part_rows
                .iter()
                .scan(0, |first, r| {
                    *first += r;
                    Some(&bytes[(*first - r) * row_bytes..*first * row_bytes])
                })
                .collect();
            let weight = QuantMatrix::upload_parts(ctx, "w", quant, cols, &parts, chunk).unwrap();
            // The residual and the sublayer at different scales in every row.
            let mut residual = rng.f32s(batch * cols, -1.0, 1.0);
            let mut sublayer = rng.f32s(batch * cols, -1.0, 1.0);
            for b in 0..batch {
                residual[b * cols..(b + 1) * cols].iter_mut().for_each(|v| *v *= 0.5 + 2.0 * b as f32);
                sublayer[b * cols..(b + 1) * cols].iter_mut().for_each(|v| *v *= 3.0 / (1.0 + b as f32));
            }
            let (pre, post) = (rng.f32s(cols, -2.0, 2.0), rng.f32s(cols, -2.0, 2.0));
            let post_normed = norm_reference(&sublayer, &post, convention, eps);
            let sum: Vec<f32> = residual.iter().zip(&post_normed).map(|(a, b)| a + b).collect();
            let normed = norm_reference(&sum, &pre, convention, eps);

            let tensor =
                |name, shape: &[usize], values: &[f32]| Tensor::from_slice(ctx, name, shape, values).unwrap();
            let residual_gpu = tensor("residual", &[batch, cols], &residual);
            let sublayer_gpu = tensor("sublayer", &[batch, cols], &sublayer);
            let norms = tensor("norms", &[2, cols], &[pre.clone(), post.clone()].concat());
            let sum_gpu = Tensor::empty(ctx, "sum", &[batch, cols]).unwrap();
            sum_gpu.fill_bits(ctx, POISON);
            let input = ResidualInput {
                residual: &residual_gpu,
                sublayer: &sublayer_gpu,
                norm_weights: &norms,
                convention,
                eps,
                sum: &sum_gpu,
            };
            let ys: Vec<Tensor> =
                part_rows.iter().map(|&r| Tensor::empty(ctx, "y", &[batch, r]).unwrap()).collect();
            ys.iter().for_each(|y| y.fill_bits(ctx, POISON));
            let mut encoder = ctx.encoder("test");
            if split {
                let outputs = ys.iter().collect::<Vec<_>>();
                let output = MatmulOutput::Split(&outputs);
                matmul(ctx, &mut encoder, &weight, MatmulInput::Residual(input), output).unwrap();
            } else {
                run(
                    ctx,
                    &mut encoder,
                    &weight,
                    MatmulInput::Residual(input),
                    MatmulOutput::Write(&ys[0]),
                    variant,
                )
                .unwrap();
            }
            ctx.submit(encoder).unwrap();
            let what = format!(
                "{path} residual {convention:?} {rows}x{cols} batch {batch}, {} chunks, {variant:?}",
                weight.chunk_count()
            );
            let got_sum = pollster::block_on(sum_gpu.to_f32(ctx)).unwrap();
            crate::kernels::testing::assert_close(&format!("{what}: sum"), &got_sum, &sum, 1e-5);
            for (i, ((y, r), part)) in ys.iter().zip(&part_rows).zip(&parts).enumerate() {
                let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                let (expected, magnitude) = reference(quant, *r, cols, part, &normed);
                assert_dot_close(&format!("{what}: part {i}"), &got, &expected, &magnitude);
            }
            // The sum may not overwrite an input; norm weights must be [2, cols].
            let bad = ResidualInput { sum: &residual_gpu, ..input };
            let output = MatmulOutput::Write(&ys[0]);
            let err = matmul(ctx, &mut ctx.encoder("test"), &weight, MatmulInput::Residual(bad), output);
            assert!(err.is_err_and(|e| e.to_string().contains("another tensor")));
            let bad = ResidualInput { norm_weights: &sublayer_gpu, ..input };
            let output = MatmulOutput::Write(&ys[0]);
            let err = matmul(ctx, &mut ctx.encoder("test"), &weight, MatmulInput::Residual(bad), output);
            assert!(
                err.is_err_and(
                    |e| e.to_string().contains("norm weights [2, ") && !e.to_string().contains("  ")
                )
            );
        }
    }
}

#[test]
fn split_weights_cover_every_row() {
    let mut rng = Rng::new("matmul split");
    for (path, ctx) in both_paths() {
        eprintln!("{path}");
        for quant in [QuantType::Q8_0, QuantType::Q6K, QuantType::Q4K, QuantType::F16] {
            let cols = test_cols(quant);
            // About 20 rows a chunk (repacked rows are up to 2 bytes longer): 259 rows make
            // 13 or 14 chunks, the last one partial.
            let chunk = 20 * quant.row_bytes(cols).unwrap() as u64 + 3;
            for batch in [1, 3, 17] {
                let chunks = check(ctx, quant, 259, cols, batch, chunk, None, &mut rng);
                assert!(chunks >= 13, "{quant}: {chunks} chunks");
            }
        }
    }
}

#[test]
fn long_rows_stay_within_bound() {
    let mut rng = Rng::new("matmul long rows");
    for (path, ctx) in both_paths() {
        eprintln!("{path}");
        check(ctx, QuantType::Q4K, 33, 256 * 24, 2, u64::MAX, None, &mut rng);
        check(ctx, QuantType::Q8_0, 33, 32 * 181, 1, u64::MAX, None, &mut rng);
    }
}

/// Stacked weights of two and three parts, split into chunks that straddle the parts, each
/// part's rows in its own output; and products added to what the output held. Through the
/// device's own variant and the tiled kernel.
#[test]
fn split_and_added_outputs_match_reference() {
    let mut rng = Rng::new("matmul split outputs");
    let ctx = gpu();
    // The device's own variant, the tiled kernel that GPUs take at large batches, and the
    // forced variants' windowed ones (the windows' offsets move the gated input's up
    // projection and the outputs' batch rows too).
    for (quant, variant) in [QuantType::Q4_1, QuantType::Q8_0, QuantType::Q6K].into_iter().flat_map(|quant| {
        let windowed = forced(gpu(), test_cols(quant)).into_iter().filter(|v| v.x_window_rows.is_some());
        [(quant, None), (quant, Some(TILED))].into_iter().chain(windowed.map(move |v| (quant, Some(v))))
    }) {
        let cols = test_cols(quant);
        for part_rows in [&[5usize, 19][..], &[33, 7, 7]] {
            for (batch, max_chunk_bytes) in [(1, u64::MAX), (17, 9 * quant.row_bytes(cols).unwrap() as u64)] {
                let parts: Vec<Vec<u8>> =
                    part_rows.iter().map(|&r| random_rows(quant, r, cols, &mut rng)).collect();
                let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                let weight =
                    QuantMatrix::upload_parts(ctx, "w", quant, cols, &slices, max_chunk_bytes).unwrap();
                let x = rng.f32s(batch * cols, -1.0, 1.0);
                let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
                let ys: Vec<Tensor> =
                    part_rows.iter().map(|&r| Tensor::empty(ctx, "y", &[batch, r]).unwrap()).collect();
                ys.iter().for_each(|y| y.fill_bits(ctx, POISON));
                let mut encoder = ctx.encoder("test");
                let outputs = ys.iter().collect::<Vec<_>>();
                let output = MatmulOutput::Split(&outputs);
                run(ctx, &mut encoder, &weight, MatmulInput::Plain(&x_gpu), output, variant).unwrap();
                ctx.submit(encoder).unwrap();
                for (p, (y, bytes)) in ys.iter().zip(&parts).enumerate() {
                    let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                    let (expected, magnitude) = reference(quant, part_rows[p], cols, bytes, &x);
                    let what = format!(
                        "{quant} parts {part_rows:?} part {p}, batch {batch}, {} chunks, {variant:?}",
                        weight.chunk_count()
                    );
                    assert_dot_close(&what, &got, &expected, &magnitude);
                }
            }
        }
        // y = (activation(gate) * up)·Wᵀ, and y += the same, for both activations.
        let (rows, batch) = (37, 6);
        let bytes = random_rows(quant, rows, cols, &mut rng);
        let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
        for activation in [GatedActivation::Silu, GatedActivation::GeluTanh] {
            let gate = rng.f32s(batch * cols, -6.0, 6.0);
            let up = rng.f32s(batch * cols, -1.0, 1.0);
            let x: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| {
                    let g = f64::from(g);
                    let activated = match activation {
                        GatedActivation::Silu => g / (1.0 + (-g).exp()),
                        GatedActivation::GeluTanh => {
                            0.5 * g * (1.0 + (0.7978845608028654 * (g + 0.044715 * g * g * g)).tanh())
                        }
                    };
                    (activated * f64::from(u)) as f32
                })
                .collect();
            let gate_gpu = Tensor::from_slice(ctx, "gate", &[batch, cols], &gate).unwrap();
            let up_gpu = Tensor::from_slice(ctx, "up", &[batch, cols], &up).unwrap();
            let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
            y.fill_bits(ctx, POISON);
            let mut encoder = ctx.encoder("test");
            let input = GatedInput { activation, gate: &gate_gpu, up: &up_gpu };
            run(ctx, &mut encoder, &weight, MatmulInput::Gated(input), MatmulOutput::Write(&y), variant)
                .unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(y.to_f32(ctx)).unwrap();
            let (expected, magnitude) = reference(quant, rows, cols, &bytes, &x);
            let what = format!("{quant} gated {activation:?}, {variant:?}");
            assert_dot_close(&what, &got, &expected, &magnitude);

            let before = rng.f32s(batch * rows, -4.0, 4.0);
            let y = Tensor::from_slice(ctx, "y", &[batch, rows], &before).unwrap();
            let mut encoder = ctx.encoder("test");
            run(ctx, &mut encoder, &weight, MatmulInput::Gated(input), MatmulOutput::AddTo(&y), variant)
                .unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(y.to_f32(ctx)).unwrap();
            let (expected, magnitude) = added(&expected, &magnitude, &before);
            assert_dot_close(&format!("{what} added"), &got, &expected, &magnitude);
        }

        // y += x·Wᵀ.
        let bytes = random_rows(quant, rows, cols, &mut rng);
        let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
        let x = rng.f32s(batch * cols, -1.0, 1.0);
        let before = rng.f32s(batch * rows, -4.0, 4.0);
        let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
        let y = Tensor::from_slice(ctx, "y", &[batch, rows], &before).unwrap();
        let mut encoder = ctx.encoder("test");
        run(ctx, &mut encoder, &weight, MatmulInput::Plain(&x_gpu), MatmulOutput::AddTo(&y), variant)
            .unwrap();
        ctx.submit(encoder).unwrap();
        let got = pollster::block_on(y.to_f32(ctx)).unwrap();
        let (product, magnitude) = reference(quant, rows, cols, &bytes, &x);
        let (expected, magnitude) = added(&product, &magnitude, &before);
        assert_dot_close(&format!("{quant} added, {variant:?}"), &got, &expected, &magnitude);
    }
}

/// The reference of a product added to `before`, and its magnitudes.
fn added(product: &[f64], magnitude: &[f64], before: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let sum = product.iter().zip(before).map(|(p, &b)| p + f64::from(b)).collect();
    let magnitude = magnitude.iter().zip(before).map(|(m, &b)| m + f64::from(b).abs()).collect();
    (sum, magnitude)
}

#[test]
fn mismatched_shapes_are_errors() {
    let ctx = gpu();
    let mut rng = Rng::new("matmul shapes");
    let bytes = random_rows(QuantType::Q8_0, 7, 64, &mut rng);
    let weight = QuantMatrix::upload(ctx, "w", QuantType::Q8_0, 7, 64, &bytes).unwrap();
    let x = Tensor::empty(ctx, "x", &[3, 64]).unwrap();
    for y_shape in [[3usize, 8], [2, 7]] {
        let y = Tensor::empty(ctx, "y", &y_shape).unwrap();
        let err =
            matmul(ctx, &mut ctx.encoder("test"), &weight, MatmulInput::Plain(&x), MatmulOutput::Write(&y))
                .unwrap_err();
        assert!(err.to_string().contains("'w' is 7 x 64"), "{err}");
    }
    let x = Tensor::empty(ctx, "x", &[3, 32]).unwrap();
    let y = Tensor::empty(ctx, "y", &[3, 7]).unwrap();
    assert!(
        matmul(ctx, &mut ctx.encoder("test"), &weight, MatmulInput::Plain(&x), MatmulOutput::Write(&y))
            .is_err()
    );
    // Split outputs must match the stacked parts, in number and in rows.
    let stacked =
        QuantMatrix::upload_stacked(ctx, "qkv", QuantType::Q8_0, 64, &[&bytes[..2 * 68], &bytes[2 * 68..]])
            .unwrap();
    let x = Tensor::empty(ctx, "x", &[3, 64]).unwrap();
    let (y2, y5, y7) = (
        Tensor::empty(ctx, "a", &[3, 2]).unwrap(),
        Tensor::empty(ctx, "b", &[3, 5]).unwrap(),
        Tensor::empty(ctx, "c", &[3, 7]).unwrap(),
    );
    let split = |weight: &QuantMatrix, outputs: &[&Tensor]| {
        matmul(ctx, &mut ctx.encoder("test"), weight, MatmulInput::Plain(&x), MatmulOutput::Split(outputs))
    };
    assert!(split(&stacked, &[&y2, &y5]).is_ok());
    for outputs in [&[&y5, &y2][..], &[&y2, &y5, &y5], &[&y7]] {
        let err = split(&stacked, outputs).unwrap_err();
        assert!(err.to_string().contains("'qkv'") || err.to_string().contains("2 or 3"), "{err}");
    }
    assert!(split(&weight, &[&y2, &y5]).is_err());
}

#[test]
fn every_variant_validates() {
    let y = Tensor::empty(gpu(), "y", &[1, 8]).unwrap();
    for quant in QuantType::ALL {
        let mut variants = FORCED.to_vec();
        for batch_tile in [1, 4, 8, 16] {
            for (row_tile, x_broadcast, x_window_rows) in [
                (1, false, None),
                (2, false, None),
                (4, false, None),
                (8, false, None),
                (4, true, None),
                (8, true, None),
                (4, false, Some(3)),
                (4, true, Some(3)),
            ] {
                variants.push(Variant {
                    wg_size: 64,
                    threads_per_row: 1,
                    row_tile,
                    batch_tile,
                    reduce: Reduce::None,
                    x_broadcast,
                    x_window_rows,
                    tiled: false,
                });
            }
            for threads_per_row in [4, 8, 16, 32] {
                variants.push(Variant {
                    wg_size: 128,
                    threads_per_row,
                    row_tile: 1,
                    batch_tile,
                    reduce: Reduce::Subgroup,
                    x_broadcast: false,
                    x_window_rows: None,
                    tiled: false,
                });
            }
            variants.push(Variant {
                wg_size: 128,
                threads_per_row: 32,
                row_tile: 1,
                batch_tile,
                reduce: Reduce::Shared,
                x_broadcast: false,
                x_window_rows: None,
                tiled: false,
            });
        }
        for (variant, textures) in variants.into_iter().flat_map(|v| [(v, false), (v, true)]) {
            let plain = MatmulInput::Plain(&y);
            validate_wgsl(&source(variant, quant, textures, plain, MatmulOutput::Write(&y)));
            validate_wgsl(&source(variant, quant, textures, plain, MatmulOutput::Split(&[&y, &y])));
            validate_wgsl(&source(variant, quant, textures, plain, MatmulOutput::Split(&[&y, &y, &y])));
            for activation in [GatedActivation::Silu, GatedActivation::GeluTanh] {
                let gated = MatmulInput::Gated(GatedInput { activation, gate: &y, up: &y });
                validate_wgsl(&source(variant, quant, textures, gated, MatmulOutput::AddTo(&y)));
            }
            for convention in [NormWeight::Scale, NormWeight::OnePlus] {
                let normed = MatmulInput::Normed(&y, RmsNorm { weight: &y, convention, eps: 1e-6 });
                validate_wgsl(&source(variant, quant, textures, normed, MatmulOutput::Write(&y)));
                validate_wgsl(&source(variant, quant, textures, normed, MatmulOutput::Split(&[&y, &y])));
                validate_wgsl(&source(variant, quant, textures, normed, MatmulOutput::Split(&[&y, &y, &y])));
            }
        }
    }
}

/// A product's pipeline found by its recipe is the one its source compiles to, and recipes that
/// differ in any way the source depends on find different pipelines.
#[test]
fn recipes_find_the_pipelines_of_their_sources() {
    let ctx = gpu();
    let x = Tensor::empty(ctx, "x", &[2, 64]).unwrap();
    let y = Tensor::empty(ctx, "y", &[2, 8]).unwrap();
    let variant = tuning::matmul_variant(ctx, QuantType::Q8_0, 8, 64, 2);
    let recipes = [
        Recipe::of(variant, QuantType::Q8_0, false, MatmulInput::Plain(&x), MatmulOutput::Write(&y)),
        Recipe::of(variant, QuantType::Q8_0, false, MatmulInput::Plain(&x), MatmulOutput::AddTo(&y)),
        Recipe::of(variant, QuantType::Q4_0, false, MatmulInput::Plain(&x), MatmulOutput::Write(&y)),
        Recipe::of(TILED, QuantType::Q8_0, false, MatmulInput::Plain(&x), MatmulOutput::Write(&y)),
    ];
    let mut found = Vec::new();
    for recipe in recipes {
        let by_recipe = ctx.pipeline_by_recipe(recipe, || recipe.source()).unwrap();
        let by_source = ctx.pipeline(&recipe.source()).unwrap();
        assert!(std::sync::Arc::ptr_eq(&by_recipe.pipeline, &by_source) && by_recipe.entry == "matmul");
        // Found again without building the source.
        let again = ctx.pipeline_by_recipe(recipe, || unreachable!("the recipe is cached")).unwrap();
        assert!(std::sync::Arc::ptr_eq(&again.pipeline, &by_source));
        found.push(by_source);
    }
    for (i, a) in found.iter().enumerate() {
        assert!(found[i + 1..].iter().all(|b| !std::sync::Arc::ptr_eq(a, b)), "recipe {i} shares a pipeline");
    }
}
