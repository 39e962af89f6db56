//! Kernel timings on real model shapes, printed: what the tables in `tuning.rs` are set from.
//! Each names the variants it compares and how it times them; BENCHMARKS.md keeps the results.
//!
//! ```text
//! cargo bench -p flint-core --features kernel-timing --bench kernels            # all
//! cargo bench -p flint-core --features kernel-timing --bench kernels -- matmul  # names containing "matmul"
//! ```
//!
//! `FLINT_ADAPTER` picks the adapter, as for the tests.

use flint_core::kernels::{attention, matmul};

/// A timing: prints its table, or says why it could not.
type Timing = fn() -> flint_core::Result<()>;

/// Each timing, by name.
const TIMINGS: [(&str, Timing); 5] = [
    ("matmul-products", matmul::timing::products),
    ("matmul-inputs", matmul::timing::inputs),
    ("matmul-sweep", matmul::timing::sweep),
    ("attention-decode", attention::timing::decode),
    ("attention-prefill", attention::timing::prefill),
];

fn main() -> std::process::ExitCode {
    // `cargo bench` passes `--bench`; the other arguments select timings by substring.
    let filters: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with("--")).collect();
    let selected: Vec<_> = TIMINGS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        let names: Vec<&str> = TIMINGS.iter().map(|(name, _)| *name).collect();
        eprintln!("no timing matches {filters:?}; the timings are: {}", names.join(", "));
        return std::process::ExitCode::FAILURE;
    }
    for (name, timing) in selected {
        println!("== {name}");
        if let Err(e) = timing() {
            eprintln!("{name} failed: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
