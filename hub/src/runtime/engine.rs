//! The one `wasmtime::Engine` every plugin runs on, and the epoch ticker that
//! turns per-call deadlines into traps.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig,
    Strategy,
};

use crate::config::MAX_PLUGIN_MEMORY_MB;

/// How often the epoch advances; deadlines are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Core instances and memories one plugin component may hold; Rust
/// `wasm32-wasip2` components use a handful of core instances and one memory.
const CORE_INSTANCES_PER_PLUGIN: u32 = 16;
const MEMORIES_PER_PLUGIN: u32 = 2;
const TABLES_PER_PLUGIN: u32 = 16;
/// Low bytes of each pooled memory kept resident between calls; covers a Rust
/// guest's stack, data and the start of its heap.
const KEEP_RESIDENT: usize = 1 << 20;
/// The guard after a 4 GiB reservation: covers the largest static offset
/// a load or store adds to its address (wasmtime's default on 64-bit).
const GUARD_BYTES: u64 = 32 << 20;

/// Builds the engine: component model, async calls, epoch interruption,
/// Cranelift, and a pooling allocator with copy-on-write memory images sized
/// for `slots` calls at once.
///
/// Each pooled memory first reserves 4 GiB of address space and a guard
/// region, so that compiled guest code needs no bounds check on its loads
/// and stores (`redact`'s call is ~1 µs faster). Where the address space is
/// limited (`ulimit -v`), that reservation fails, and the engine reserves
/// only what a plugin may use, with explicit bounds checks instead.
pub fn build(slots: u32) -> wasmtime::Result<Engine> {
    match Engine::new(&config(slots, Reservation::Guarded)) {
        Ok(engine) => Ok(engine),
        Err(e) => {
            tracing::warn!(
                error = %format!("{e:#}"),
                "plugin memories cannot reserve 4 GiB of address space each (is `ulimit -v` set?); \
                 reserving only what a plugin may use, guest code checks its memory accesses"
            );
            Engine::new(&config(slots, Reservation::Tight))
        }
    }
}

/// How much address space each pooled linear memory reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reservation {
    /// 4 GiB and a guard region: out-of-bounds accesses fault in the guard
    /// pages, so Cranelift emits no bounds checks (wasmtime's default). The
    /// pool takes about 8 GiB of address space per call slot.
    Guarded,
    /// The most a plugin may use: the pool stays a few dozen GiB, so the hub
    /// starts where virtual memory is limited; every access is checked.
    Tight,
}

fn config(slots: u32, reservation: Reservation) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_core_instances(slots * CORE_INSTANCES_PER_PLUGIN)
        .total_memories(slots * MEMORIES_PER_PLUGIN)
        .total_tables(slots * TABLES_PER_PLUGIN)
        .total_stacks(slots)
        .max_core_instances_per_component(CORE_INSTANCES_PER_PLUGIN)
        .max_memories_per_component(MEMORIES_PER_PLUGIN)
        .max_tables_per_component(TABLES_PER_PLUGIN)
        .max_memory_size((MAX_PLUGIN_MEMORY_MB as usize) << 20)
        // A fresh store per call must not pay page faults for pages the last
        // call touched: reset the dirty pages in place (PAGEMAP_SCAN where the
        // kernel has it, else memset of the low addresses) instead of
        // returning them to the kernel.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .concurrency_support(false)
        .epoch_interruption(true)
        .strategy(Strategy::Cranelift)
        .cranelift_opt_level(OptLevel::Speed)
        .memory_init_cow(true);
    match reservation {
        Reservation::Guarded => config
            .memory_reservation(4 << 30)
            .memory_guard_size(GUARD_BYTES),
        Reservation::Tight => config
            .memory_reservation((MAX_PLUGIN_MEMORY_MB as u64) << 20)
            .memory_guard_size(64 << 10),
    };
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// Ticks without a sandbox alive after which the ticker sleeps until one
/// is made: an idle hub should not wake a thousand times a second.
const IDLE_TICKS: u32 = 100;

/// Advances the engine's epoch every [`EPOCH_TICK`] while sandboxes exist
/// (and for [`IDLE_TICKS`] after the last), until dropped.
pub struct Ticker {
    shared: Arc<TickerShared>,
}

struct TickerShared {
    stop: AtomicBool,
    /// Sandboxes alive: the ticker must run while any is.
    alive: AtomicUsize,
    /// The ticker is asleep (or about to be) until a sandbox is made.
    parked: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
}

/// Held by every sandbox for its life: while any is held the epoch
/// advances, so its deadline can stop guest code.
pub struct Awake {
    shared: Arc<TickerShared>,
}

impl Drop for Awake {
    fn drop(&mut self) {
        self.shared.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticker {
    pub fn start(engine: &Engine) -> std::io::Result<Ticker> {
        let shared = Arc::new(TickerShared {
            stop: AtomicBool::new(false),
            alive: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let ticking = shared.clone();
        // A weak handle: the ticker must not keep a dropped runtime's engine alive.
        let engine = engine.weak();
        let handle = std::thread::Builder::new()
            .name("hub-epoch".into())
            .spawn(move || {
                let mut idle = 0u32;
                while !ticking.stop.load(Ordering::Relaxed) {
                    if ticking.alive.load(Ordering::SeqCst) > 0 {
                        idle = 0;
                    } else if idle < IDLE_TICKS {
                        idle += 1;
                    } else {
                        // Announced before looking again, as `awake` counts
                        // before looking: one of the two sees the other.
                        ticking.parked.store(true, Ordering::SeqCst);
                        if ticking.alive.load(Ordering::SeqCst) == 0
                            && !ticking.stop.load(Ordering::SeqCst)
                        {
                            std::thread::park();
                        }
                        ticking.parked.store(false, Ordering::SeqCst);
                        idle = 0;
                    }
                    std::thread::sleep(EPOCH_TICK);
                    match engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })?;
        let _ = shared.thread.set(handle.thread().clone());
        Ok(Ticker { shared })
    }

    /// Keeps the epoch advancing while the returned guard lives.
    pub fn awake(&self) -> Awake {
        self.shared.alive.fetch_add(1, Ordering::SeqCst);
        if self.shared.parked.load(Ordering::SeqCst) {
            self.unpark();
        }
        Awake {
            shared: self.shared.clone(),
        }
    }

    fn unpark(&self) {
        if let Some(thread) = self.shared.thread.get() {
            thread.unpark();
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.unpark();
    }
}
