//! Allocates 100,000 addresses from a /15 and prints the time and the process's peak memory.
//!
//!     cargo run --release -p loxi-domain --example ipam_bench
//!
//! Claiming is O(log n) per address (free space is a set of intervals), so the time per
//! address stays flat whether the pool is a /24 or a /15.

use std::time::Instant;

use loxi_domain::ipam::Family;
use loxi_domain::{Allocator, Pool};

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    const N: usize = 100_000;
    let owners: Vec<String> = (0..N).map(|i| format!("ns-{}/svc-{i}", i % 100)).collect();
    let rss_before = peak_rss_kib();
    let mut a = Allocator::new(vec![Pool::new("big", vec!["10.0.0.0/15".parse().unwrap()])]);

    let started = Instant::now();
    for owner in &owners {
        a.allocate(owner, None, Family::V4).expect("room in a /15");
    }
    let allocate = started.elapsed();

    // Free every other address, then allocate again into the holes (the fragmented case).
    let started = Instant::now();
    for owner in owners.iter().step_by(2) {
        a.release_owner(owner);
    }
    let release = started.elapsed();
    let started = Instant::now();
    for owner in owners.iter().step_by(2) {
        a.allocate(owner, None, Family::V4).expect("holes to fill");
    }
    let refill = started.elapsed();

    // Rebuild from the durable record (what a restart does).
    let record: Vec<_> = owners
        .iter()
        .map(|o| (a.addresses_of(o)[0], o.clone()))
        .collect();
    let started = Instant::now();
    let mut b = Allocator::new(vec![Pool::new("big", vec!["10.0.0.0/15".parse().unwrap()])]);
    for (ip, owner) in &record {
        b.assign(*ip, owner).unwrap();
    }
    let rebuild = started.elapsed();
    assert_eq!(b.used(), N);

    let per = |d: std::time::Duration, n: usize| d.as_nanos() as f64 / n as f64;
    println!("addresses: {N} from 10.0.0.0/15 (131,070 usable)");
    println!(
        "allocate: {:.1} ms total, {:.0} ns/address",
        allocate.as_secs_f64() * 1e3,
        per(allocate, N)
    );
    println!(
        "release half: {:.1} ms, refill the holes: {:.1} ms ({:.0} ns/address)",
        release.as_secs_f64() * 1e3,
        refill.as_secs_f64() * 1e3,
        per(refill, N / 2)
    );
    println!(
        "rebuild from record: {:.1} ms ({:.0} ns/address)",
        rebuild.as_secs_f64() * 1e3,
        per(rebuild, N)
    );
    println!(
        "peak RSS: {} KiB (before allocators: {} KiB; two allocators of {N} owners each)",
        peak_rss_kib(),
        rss_before
    );
}
