//! Compiled plugins kept on disk by content hash, so a restart (or a reload
//! that did not change a plugin) does not compile it again; in the `hub`
//! binary, compiled by a child process.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where compiled components live; files are named by the hash of the
/// `.wasm` bytes and of the engine settings they were compiled for.
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
    /// The engine's call slots, which a compiling child builds its engine
    /// with.
    slots: u32,
}

/// The program that compiles plugins for this process: set once by the
/// `hub` binary (itself, `hub compile-plugin`); unset, this process
/// compiles them.
static COMPILER: OnceLock<PathBuf> = OnceLock::new();

/// Plugins this process compiles from now on are compiled by `program
/// compile-plugin` (see [`compile_into`]). Why a child process: compiling
/// leaves the compiler's code pages and its allocator arenas in the process
/// that ran it, ~14 MB with the six example plugins, for as long as it
/// runs (docs/performance.md, "What the figures depend on"); and a plugin that makes the
/// compiler fail badly fails the child, not the hub.
pub fn compile_in_child(program: PathBuf) {
    let _ = COMPILER.set(program);
}

/// What `hub compile-plugin` does: compiles `wasm` for an engine with
/// `slots` call slots and stores it in `dir`, where the parent looks.
pub fn compile_into(dir: &Path, slots: u32, wasm: &[u8]) -> Result<(), String> {
    let engine = super::engine::build(slots).map_err(|e| format!("{e:#}"))?;
    let file = ComponentCache::new(dir.to_owned(), slots).file(&engine, wasm);
    let component = Component::new(&engine, wasm).map_err(|e| format!("{e:#}"))?;
    store(&file, &component).map_err(|e| e.to_string())
}

/// How a component was obtained, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    Cached,
}

impl ComponentCache {
    pub fn new(dir: PathBuf, slots: u32) -> ComponentCache {
        ComponentCache { dir, slots }
    }

    fn file(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        self.dir.join(format!(
            "{}-{:016x}.cwasm",
            hex::encode(Sha256::digest(wasm)),
            engine_hash(engine)
        ))
    }

    /// The compiled form of `wasm`, from the cache when it holds one for this
    /// engine, else compiled now (by a child process, see
    /// [`compile_in_child`]) and stored. A cache that cannot be written
    /// only costs a compile at the next start.
    // SAFETY: the one unsafe call, `Component::deserialize_file`, is explained
    // where it is made.
    #[allow(
        unsafe_code,
        reason = "deserializing a component we compiled and cached ourselves"
    )]
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<(Component, Origin)> {
        let file = self.file(engine, wasm);
        if file.exists() {
            // SAFETY: the cache directory is the hub's own; files in it were
            // written by `Component::serialize` of an engine with the same
            // compatibility hash (it is part of the name). Anything else that
            // fails to load is recompiled below.
            match unsafe { Component::deserialize_file(engine, &file) } {
                Ok(component) => return Ok((component, Origin::Cached)),
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "ignoring an unusable cached plugin")
                }
            }
        }
        if let Some(program) = COMPILER.get() {
            match self.compile_elsewhere(program, wasm) {
                // SAFETY: as above; the child wrote it with an engine of
                // the same settings (the name holds their hash).
                Ok(()) => match unsafe { Component::deserialize_file(engine, &file) } {
                    Ok(component) => return Ok((component, Origin::Compiled)),
                    Err(e) => {
                        tracing::warn!(file = %file.display(), error = %e, "a plugin compiled by a child process cannot be loaded; compiling it here")
                    }
                },
                // The compiler refused it: compiled here, it fails with
                // the error the plugin's author should read.
                Err(Elsewhere::Refused(e)) => {
                    tracing::debug!(error = %e, "a child process refused to compile a plugin")
                }
                Err(Elsewhere::Failed(e)) => {
                    tracing::warn!(error = %e, "no child process could compile a plugin; compiling it here")
                }
            }
        }
        let component = Component::new(engine, wasm)?;
        release_compile_memory();
        if let Err(e) = store(&file, &component) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot cache a compiled plugin");
            return Ok((component, Origin::Compiled));
        }
        // The stored copy, not the one just compiled: its code is then
        // pages of the file, as after a restart, instead of heap the
        // process keeps (docs/performance.md, "What the figures depend on").
        // SAFETY: as above; the file was written by this engine just now.
        match unsafe { Component::deserialize_file(engine, &file) } {
            Ok(stored) => Ok((stored, Origin::Compiled)),
            Err(_) => Ok((component, Origin::Compiled)),
        }
    }
}

/// Gives the memory compiling in this process used back to the system.
/// Cranelift's work is freed when a compile ends, but glibc's allocator
/// keeps freed heap for later allocations, and a hub that compiled its
/// plugins at start would hold it for good. (`hub serve` allocates with
/// jemalloc, which gives freed pages back by itself after a few seconds;
/// this is for the library under glibc's allocator, as in tests.)
fn release_compile_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` only returns free pages of glibc's heaps to
        // the kernel; it touches no memory in use.
        #[allow(unsafe_code, reason = "malloc_trim after compiling")]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Why a child process did not compile a plugin.
enum Elsewhere {
    /// It ran and said why (an invalid component, say).
    Refused(String),
    /// It could not run or did not end normally.
    Failed(String),
}

impl ComponentCache {
    /// Runs `program compile-plugin` with `wasm` on its standard input.
    fn compile_elsewhere(&self, program: &Path, wasm: &[u8]) -> Result<(), Elsewhere> {
        let mut child = Command::new(program)
            .arg("compile-plugin")
            .arg("--cache-dir")
            .arg(&self.dir)
            .arg("--slots")
            .arg(self.slots.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Elsewhere::Failed(format!("{}: {e}", program.display())))?;
        let written = match child.stdin.take() {
            Some(mut stdin) => stdin.write_all(wasm).map_err(|e| e.to_string()),
            None => Err("no standard input".to_owned()),
        };
        let out = child
            .wait_with_output()
            .map_err(|e| Elsewhere::Failed(e.to_string()))?;
        let why = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        match out.status.code() {
            Some(0) => written.map_err(Elsewhere::Failed),
            Some(_) => Err(Elsewhere::Refused(why)),
            None => Err(Elsewhere::Failed(format!("{why} ({})", out.status))),
        }
    }
}

fn store(file: &Path, component: &Component) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = component.serialize()?;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Written aside and renamed so a concurrent start never reads half a file.
    let partial = file.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, file)?;
    Ok(())
}

fn engine_hash(engine: &Engine) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    h.finish()
}
