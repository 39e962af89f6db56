//! The real SmolLM2 engine for the end-to-end tests of the engine: its step loop on a thread of
//! its own, as the native host runs it, one engine at a time.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_core::engine::{Engine, EngineMetrics, EngineOptions};
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_e2e::SMOLLM2;

fn gpu() -> Arc<GpuContext> {
    static GPU: OnceLock<Arc<GpuContext>> = OnceLock::new();
    GPU.get_or_init(|| {
        pollster::block_on(GpuContext::new(&GpuOptions::from_env()))
            .unwrap_or_else(|e| panic!("GPU tests need an adapter (they never skip): {e}"))
    })
    .clone()
}

/// An engine whose step loop runs on its own thread until the engine and its streams are gone.
///
/// One runs at a time: the tests share one GPU (on lavapipe, the machine's cores), and two of
/// them compare times within a run, which another test's steps would skew.
pub struct Running {
    pub engine: Engine,
    step_loop: JoinHandle<()>,
    _turn: MutexGuard<'static, ()>,
}

impl Running {
    pub fn start(options: EngineOptions) -> Self {
        static TURN: Mutex<()> = Mutex::new(());
        // A test that failed while holding the lock poisons it; the next one still runs.
        let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let file = GgufFile::open(SMOLLM2.path()).unwrap();
        let (engine, step_loop) = Engine::load(gpu(), &file, options).unwrap();
        let step_loop = std::thread::spawn(move || futures::executor::block_on(step_loop.run()));
        Running { engine, step_loop, _turn: turn }
    }

    /// Drops the last handle: the step loop must then end, without a panic.
    pub fn finish(self) {
        drop(self.engine);
        self.step_loop.join().expect("the step loop panicked");
    }

    /// Waits until nothing runs or waits; the metrics then.
    pub fn idle_metrics(&self) -> EngineMetrics {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let metrics = self.engine.metrics();
            if metrics.running_sequences == 0 && metrics.waiting_sequences == 0 {
                return metrics;
            }
            assert!(Instant::now() < deadline, "the engine did not go idle: {metrics:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
