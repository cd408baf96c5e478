//! The relay's memory allocator: jemalloc, for Rust and for the statically
//! linked librdkafka alike (`unprefixed_malloc_on_supported_platforms`
//! makes it the process's `malloc`/`free`).
//!
//! Why jemalloc: every record costs librdkafka about ten small allocations
//! (the message with its copy of the payload, the header list, each
//! header), made on the relay's thread and freed on the delivery-report
//! thread. glibc's allocator spent a fifth of the relay's CPU on those
//! cross-thread frees; mimalloc (v2, the allocator before this one) about
//! 1 µs per outbox event, collecting them back on the allocating thread.
//! jemalloc's thread caches take the frees on the freeing thread and hand
//! them back in batches. The A/B in docs/benchmarks.md ("jemalloc instead
//! of mimalloc") has the numbers.

use tikv_jemallocator::Jemalloc;

#[global_allocator]
static ALLOCATOR: Jemalloc = Jemalloc;

/// jemalloc's options, read by jemalloc itself at its first allocation
/// (its `malloc_conf` symbol; `MALLOC_CONF` in the environment still
/// overrides them one by one):
/// - `narenas:1`: one arena for all threads. The relay has three busy
///   threads (the session, librdkafka's broker thread, the delivery
///   reports); jemalloc's default of four arenas per core gives each its
///   own arena and its own dirty pages.
/// - `dirty_decay_ms:1000`, `muzzy_decay_ms:0`: freed pages go back to the
///   kernel after a second instead of ten.
///
/// With jemalloc's defaults the relay held 63-88 MB resident during a
/// drain (the target is 64 MB); with these options 39-50 MB, less than
/// mimalloc's 47-67, and the batched drains were the fastest of the three
/// (one-event outbox transactions 6 % slower than with mimalloc).
///
/// A thin, nullable pointer to a NUL-terminated string is what jemalloc
/// reads (`const char *malloc_conf`): `Option<&u8>` has exactly that
/// layout, and needs no `unsafe`.
#[export_name = "malloc_conf"]
static MALLOC_CONF: Option<&'static u8> = Some(&CONF[0]);

const CONF: &[u8] = b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";
