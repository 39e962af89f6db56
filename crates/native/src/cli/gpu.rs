//! `flint gpu`: the adapter flint picks, its features and limits, and its memory bandwidth.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::kernels::copy::measure_bandwidth;

#[derive(Args)]
pub struct GpuArgs {
    /// Size of the bandwidth probe buffer in MiB (0 skips the measurement).
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    probe_mib: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn gpu(args: &GpuArgs) -> anyhow::Result<()> {
    let ctx = pollster::block_on(GpuContext::new(&GpuOptions::from_env()))?;
    let device = ctx.describe();
    let bandwidth = if args.probe_mib == 0 {
        None
    } else {
        let start = Instant::now();
        let now_s = || start.elapsed().as_secs_f64();
        Some(pollster::block_on(measure_bandwidth(&ctx, args.probe_mib << 20, 9, &now_s))?)
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = serde_json::json!({ "device": device, "bandwidth": bandwidth });
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    writeln!(out, "adapter:   {} ({}, {})", device.adapter, device.backend, device.device_type)?;
    writeln!(out, "driver:    {}", device.driver)?;
    let f = device.features;
    writeln!(
        out,
        "features:  subgroups={} shader-f16={} timestamps={}",
        f.subgroups, f.shader_f16, f.timestamps
    )?;
    writeln!(
        out,
        "limits:    storage binding {} MiB, buffer {} MiB, workgroup memory {} KiB",
        device.max_storage_binding_bytes >> 20,
        device.max_buffer_bytes >> 20,
        device.max_workgroup_storage_bytes >> 10
    )?;
    if let Some(b) = bandwidth {
        writeln!(
            out,
            "bandwidth: copy {:.2} GB/s (read+write), read {:.2} GB/s, weights read {:.2} GB/s, on {} MiB",
            b.copy_bytes_per_s / 1e9,
            b.read_bytes_per_s / 1e9,
            b.weight_read_bytes_per_s / 1e9,
            b.buffer_bytes >> 20
        )?;
    }
    Ok(())
}
