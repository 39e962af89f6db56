//! Timings of the matmul variants on real model shapes, which the tables in `tuning.rs` are set
//! from: run by `crates/core/benches/kernels.rs` (`cargo bench -p flint-core --features
//! kernel-timing --bench kernels -- matmul`), printed, never asserted.

use super::*;
use crate::kernels::testing::{Rng, both_paths, gpu};
use crate::quant::random_rows;

/// Records `reps` products of `input` into `y` through `variant`, submits them and waits.
fn run_products(
    ctx: &GpuContext,
    weight: &QuantMatrix,
    input: MatmulInput,
    y: &Tensor,
    batch: usize,
    variant: Variant,
    reps: usize,
) -> Result<()> {
    let mut encoder = ctx.encoder("timing");
    for _ in 0..reps {
        record(ctx, &mut encoder, weight, input, MatmulOutput::Write(y), batch, variant)?;
    }
    ctx.submit(encoder)?;
    pollster::block_on(y.to_f32(ctx))?;
    Ok(())
}

/// Prints the wall time of the device's own variant on prefill-shaped products (SmolLM2-135M's
/// Q4_1 576 x 1536 projection and its 49152 x 576 Q8_0 LM head) at batches 1, 8 and 64, on the
/// device with its optional features and on its portable path.
pub fn products() -> Result<()> {
    let mut rng = Rng::new("matmul timing");
    for ((path, ctx), (quant, rows, cols)) in both_paths()
        .into_iter()
        .flat_map(|p| [(p, (QuantType::Q4_1, 1536, 576)), (p, (QuantType::Q8_0, 49152, 576))])
    {
        let bytes = random_rows(quant, rows, cols, &mut rng);
        let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes)?;
        for batch in [1, 8, 64] {
            let x = Tensor::from_slice(ctx, "x", &[batch, cols], &rng.f32s(batch * cols, -1.0, 1.0))?;
            let y = Tensor::empty(ctx, "y", &[batch, rows])?;
            let variant = tuning::matmul_variant(ctx, quant, rows, cols, batch);
            let input = MatmulInput::Plain(&x);
            run_products(ctx, &weight, input, &y, batch, variant, 1)?;
            let reps = if rows * batch > 1 << 20 { 3 } else { 20 };
            let start = std::time::Instant::now();
            run_products(ctx, &weight, input, &y, batch, variant, reps)?;
            let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let gflops = 2.0 * (rows * cols * batch) as f64 / ms / 1e6;
            println!(
                "{path}: {quant} {rows}x{cols} batch {batch}: {ms:.2} ms ({gflops:.1} GFLOP/s), {variant:?}"
            );
        }
    }
    Ok(())
}

/// Prints the wall time of gemma3's 4096 x 640 Q5_0 gate/up product with a plain, a normalised
/// and a residual input, through the device's own tile and others (min of 3 alternating runs
/// of 5): what `tuning::fuses_residual_input` is set from.
pub fn inputs() -> Result<()> {
    let mut rng = Rng::new("matmul timing inputs");
    let ctx = gpu();
    let (quant, rows, cols) = (QuantType::Q5_0, 4096, 640);
    let bytes = random_rows(quant, rows, cols, &mut rng);
    let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes)?;
    let norms = Tensor::from_slice(ctx, "norms", &[2, cols], &rng.f32s(2 * cols, -1.0, 1.0))?;
    let norm_weight = Tensor::from_slice(ctx, "norm", &[cols], &rng.f32s(cols, -1.0, 1.0))?;
    for batch in [1, 16, 64] {
        let mut tensor = || Tensor::from_slice(ctx, "x", &[batch, cols], &rng.f32s(batch * cols, -1.0, 1.0));
        let (x, sublayer, sum) = (tensor()?, tensor()?, tensor()?);
        let y = Tensor::empty(ctx, "y", &[batch, rows])?;
        let norm = RmsNorm { weight: &norm_weight, convention: NormWeight::Scale, eps: 1e-6 };
        let residual = ResidualInput {
            residual: &x,
            sublayer: &sublayer,
            norm_weights: &norms,
            convention: NormWeight::Scale,
            eps: 1e-6,
            sum: &sum,
        };
        let inputs = [
            ("plain", MatmulInput::Plain(&x)),
            ("normed", MatmulInput::Normed(&x, norm)),
            ("residual", MatmulInput::Residual(residual)),
        ];
        // The device's own tile, then others, for each input: the best tile of one input
        // need not be another's.
        let chosen = tuning::matmul_variant(ctx, quant, rows, cols, batch);
        let tiles = [(chosen.row_tile, chosen.batch_tile), (2, 2), (2, 4), (4, 2), (4, 4), (1, 8)];
        let mut cases: Vec<(&str, MatmulInput, Variant, f64)> = Vec::new();
        for (row_tile, batch_tile) in tiles.into_iter().filter(|&(_, t)| t as usize <= batch) {
            for &(name, input) in &inputs {
                cases.push((name, input, Variant { row_tile, batch_tile, ..chosen }, f64::MAX));
            }
        }
        for _ in 0..3 {
            for (_, input, variant, best) in &mut cases {
                run_products(ctx, &weight, *input, &y, batch, *variant, 1)?;
                let start = std::time::Instant::now();
                run_products(ctx, &weight, *input, &y, batch, *variant, 5)?;
                *best = best.min(start.elapsed().as_secs_f64() * 1e3 / 5.0);
            }
        }
        for (name, _, variant, ms) in cases {
            let (r, t) = (variant.row_tile, variant.batch_tile);
            println!("{quant} {rows}x{cols} batch {batch} {name:>8}, tile {r} x {t}: {ms:.2} ms");
        }
    }
    Ok(())
}

/// Times, with GPU timestamps, the variants a GPU could take on SmolLM2's and gemma3's product
/// shapes at batch sizes from decode to prefill, and prints the best three and the device's
/// choice (medians of 9 dispatches): what `tuning::matmul_variant` for GPUs is set from. Needs
/// timestamp queries; prints why it times nothing without them.
pub fn sweep() -> Result<()> {
    let ctx = gpu();
    if !ctx.features().timestamps {
        println!("{}: no timestamp queries, nothing timed", ctx.adapter_info().name);
        return Ok(());
    }
    let mut rng = Rng::new("matmul timing sweep");
    let shapes = [
        (QuantType::Q4_1, 1536, 576),
        (QuantType::Q4_1, 576, 1536),
        (QuantType::Q4K, 640, 2048),
        (QuantType::Q8_0, 49152, 576),
    ];
    println!("{}: median of 9 dispatches, GPU timestamps", ctx.adapter_info().name);
    for (quant, rows, cols) in shapes {
        let bytes = random_rows(quant, rows, cols, &mut rng);
        let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes)?;
        for batch in [1, 4, 8, 16, 32, 64, 128, 256] {
            let x = Tensor::from_slice(ctx, "x", &[batch, cols], &rng.f32s(batch * cols, -1.0, 1.0))?;
            let y = Tensor::empty(ctx, "y", &[batch, rows])?;
            let mut variants = vec![TILED];
            for threads_per_row in [8, 32] {
                for row_tile in [1, 2, 4] {
                    for batch_tile in
                        [1u32, 4, 8, 16].into_iter().filter(|&t| t as usize <= batch.next_power_of_two())
                    {
                        variants.push(Variant {
                            wg_size: 128,
                            threads_per_row,
                            row_tile,
                            batch_tile,
                            reduce: Reduce::Subgroup,
                            x_broadcast: false,
                            x_window_rows: None,
                            tiled: false,
                        });
                    }
                }
            }
            let chosen = tuning::matmul_variant(ctx, quant, rows, cols, batch);
            let mut times: Vec<(f64, Variant)> = Vec::new();
            for variant in variants {
                let record_times = |times: usize| -> Result<()> {
                    let mut encoder = ctx.encoder("timing");
                    for _ in 0..times {
                        let (input, outputs) = (MatmulInput::Plain(&x), MatmulOutput::Write(&y));
                        record(ctx, &mut encoder, &weight, input, outputs, batch, variant)?;
                    }
                    ctx.submit(encoder)
                };
                let time = || -> Result<f64> {
                    record_times(1)?;
                    ctx.start_profile(9)?;
                    record_times(9)?;
                    let mut seconds: Vec<f64> =
                        pollster::block_on(ctx.finish_profile())?.iter().map(|t| t.seconds).collect();
                    seconds.sort_by(f64::total_cmp);
                    Ok(seconds[seconds.len() / 2])
                };
                match time() {
                    Ok(seconds) => times.push((seconds, variant)),
                    Err(e) => println!("  {variant:?}: {e}"),
                }
            }
            times.sort_by(|a, b| a.0.total_cmp(&b.0));
            let describe = |(seconds, v): &(f64, Variant)| {
                let gflops = 2.0 * (rows * cols * batch) as f64 / seconds / 1e9;
                let shape = if v.tiled {
                    "tiled 64x64".to_string()
                } else {
                    format!("tpr {} rows {} batch {}", v.threads_per_row, v.row_tile, v.batch_tile)
                };
                format!("{:.1} us {shape} ({gflops:.0} GFLOP/s)", seconds * 1e6)
            };
            let chosen_time = times.iter().find(|(_, v)| *v == chosen).map(describe);
            let best: Vec<String> = times.iter().take(3).map(describe).collect();
            println!(
                "{quant} {rows}x{cols} batch {batch}: best {}; chosen {}",
                best.join(", "),
                chosen_time.unwrap_or_else(|| format!("{chosen:?}, not in the sweep"))
            );
        }
    }
    Ok(())
}
