//! Sample reports for the tests of the report, its renderers and the
//! dashboard: every section filled with plausible values; and names for
//! the tests of report assembly ([`names`]).

mod allocator;
mod locks;
mod names;
pub use crate::features::cache::fixture::sample_cache_use;
use crate::features::cache::section::CacheUse;
pub use allocator::{sample_heap_profile, sample_syscalls};
pub use locks::sample_unnecessary;
pub use names::*;

use super::model::{
    BlockOrigin::{New, Reused},
    SizeClass::{Large, Small},
    *,
};

/// The allocator's untraced cost per call, as the helper times it.
fn sample_untraced() -> UntracedCostReport {
    UntracedCostReport {
        size: 64,
        malloc_ns: 6.5,
        free_ns: 11.0,
        calloc_ns: 17.5,
        pair_ns: 17.5,
        heap_spread: 0.02,
        rounds: 120_000,
        measurements: 2,
        drift: 0.03,
        pair_range_ns: [17.0, 18.0],
    }
}

/// A two-and-a-half-second session of `./work 2`: one hot function, one
/// thread, no other section filled.
pub fn sample_report() -> Report {
    Report {
        schema: Schema,
        target: Target {
            pid: 42,
            command: "./work 2".into(),
            threads_seen: 3,
            exited: false,
            processes: Vec::new(),
        },
        duration_s: 2.5,
        sampling: Sampling {
            source: SampleSource::CpuClock,
            frequency_hz: 999,
            scope: SamplingScope::Threads,
            samples: 1000,
            lost: 0,
            lost_thread_events: 0,
            stack_errors: 0,
            kernel_samples: 10,
            addresses: AddressSampling::default(),
            interrupt_ns: Some(1_500.0),
            interrupt_share: Some(0.0015),
            switches_per_s: Some(14_200.0),
        },
        hot_functions: vec![HotFunctionEntry {
            function: "spin".into(),
            file: Some("/src/work.c".into()),
            line: Some(12),
            module: "work".into(),
            samples: 900,
            share: 0.9,
            total_samples: 950,
            total_share: 0.95,
        }],
        threads: vec![ThreadEntry {
            tid: 42,
            pid: 42,
            ns_tid: None,
            name: "work".into(),
            samples: 1000,
            created_by: None,
            exited: false,
        }],
        false_sharing: vec![],
        false_sharing_dismissed: vec![],
        allocator: Default::default(),
        locks: vec![],
        lock_tracing: None,
        lock_contention: None,
        loader: sample_loader(2.5),
        notes: vec![],
        cpu_stacks: None,
        alloc_chains: None,
        // As in a session: the cache-use analysis runs and found nothing.
        sections: {
            let mut sections = crate::report::section::Sections::default();
            sections.put(Box::new(CacheUse::default()));
            sections
        },
    }
}

/// The profiler's cost over `duration_s`, its programs' part from
/// [`KernelCost::sample`](crate::kernel::cost::KernelCost::sample).
pub fn sample_loader(duration_s: f64) -> Loader {
    let usage = Usage {
        cpu_s: 0.01,
        peak_rss_bytes: 20 << 20,
    };
    Loader::new(
        usage,
        &crate::kernel::cost::KernelCost::sample(),
        duration_s,
    )
}

/// A word of a shared line, touched by `threads`.
pub fn fixture_word(offset: u32, reads: u64, writes: u64, threads: &[u32]) -> WordEntry {
    WordEntry {
        offset,
        reads,
        writes,
        threads: threads.to_vec(),
        field: None,
    }
}

/// Code in `sharing.c` touching a shared line.
pub fn fixture_code(
    function: &str,
    line: u32,
    reads: u64,
    writes: u64,
    threads: &[u32],
) -> SharingCode {
    SharingCode {
        function: function.into(),
        file: Some("/src/sharing.c".into()),
        line: Some(line),
        inlined_into: vec![],
        module: "sharing".into(),
        reads,
        writes,
        threads: threads.to_vec(),
        offset: 0,
    }
}

/// Threads 15027 and 15028 write bytes 0-7 and 8-15 of a heap block.
pub fn false_sharing_entry() -> SharingEntry {
    SharingEntry {
        line: "0x5555deadbe40".into(),
        kind: SharingKind::False,
        invalidations: 3753,
        invalidation_rate: 0.99,
        samples: 3779,
        cost_share: 0.951,
        cost_samples: 3779,
        predicted_gain: None,
        threads: vec![15027, 15028],
        processes: Vec::new(),
        object: SharedObject {
            kind: ObjectKind::Heap,
            name: "64-byte heap block from sharing.c:120".into(),
            offset: 0,
            size: Some(64),
            alloc_site: Some(CodeRef {
                function: "main".into(),
                file: Some("/src/sharing.c".into()),
                line: Some(120),
                inlined_into: vec![],
                via: None,
            }),
            type_name: None,
        },
        words: vec![
            fixture_word(0, 0, 90, &[15027]),
            fixture_word(4, 0, 90, &[15027]),
            fixture_word(8, 0, 90, &[15028]),
            fixture_word(12, 0, 90, &[15028]),
        ],
        code: vec![fixture_code("worker", 80, 0, 3779, &[15027, 15028])],
        dependences: Dependences::default(),
        advice: "Threads write different parts of this line (thread 15027 bytes 0-7, \
                 thread 15028 bytes 8-15). Give each thread's part its own cache line: \
                 align the per-thread element to 64 bytes."
            .into(),
    }
}

/// One split of the latency table.
pub fn op(
    op: AllocOp,
    class: SizeClass,
    origin: Option<BlockOrigin>,
    count: u64,
    mean_ns: u64,
) -> OpStats {
    OpStats {
        op,
        class,
        origin,
        phase: ThreadPhase::Parallel,
        count: Some(count),
        traced: count,
        mean_ns: Some(mean_ns),
        p50_ns: Some(mean_ns / 10 * 8),
        p50_basis: Some(LatencyBasis::Traced),
        p99_ns: Some(mean_ns.saturating_mul(6)),
        max_ns: Some(mean_ns.saturating_mul(40)),
        histogram: vec![
            (64, count / 4),
            (128, count / 2),
            (512, count / 4),
            (4096, 3),
        ],
        syscalls: 0,
        syscall_ns: 0,
        page_faults: 0,
    }
}

/// A site in `work.c`.
pub fn site(function: &str, line: u32, bytes: u64, live_bytes: u64) -> SiteEntry {
    SiteEntry {
        function: function.into(),
        file: Some("/src/work.c".into()),
        line: Some(line),
        module: "work".into(),
        inlined_into: vec![],
        via: None,
        count: Some(bytes / 64),
        traced: bytes / 64,
        bytes: Some(bytes),
        live_bytes,
        live_blocks: live_bytes / 64,
    }
}

/// An allocator profile in full mode with every part filled.
pub fn sample_allocator() -> AllocatorReport {
    AllocatorReport {
        library: Some("glibc 2.36".into()),
        path: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
        mode: TraceMode::Full,
        traced_fraction: 1.0,
        sampled: false,
        count_error: None,
        large_rule: "glibc mmapped chunk".into(),
        calls_traced: 123_456,
        untracked_blocks: 0,
        named_at_wrapper: 0,
        always_traced: vec![],
        lost: 0,
        probe_cost_ns: None,
        untraced_ns: Some(sample_untraced()),
        count_basis: None,
        cpu: Some(sample_cpu()),
        ops: vec![
            op(AllocOp::Malloc, Small, Some(Reused), 60_000, 45),
            op(AllocOp::Free, Small, Some(Reused), 59_000, 30),
            OpStats {
                syscalls: 120,
                syscall_ns: 1_500_000,
                page_faults: 3_840,
                ..op(AllocOp::Malloc, Large, Some(New), 120, 12_500)
            },
            op(AllocOp::Free, Large, Some(New), 118, 9_000),
            op(AllocOp::Realloc, Small, None, 900, 210),
        ],
        syscalls: sample_syscalls(),
        memory: Some(MemoryReport {
            requested_peak: 40 << 20,
            requested_at_peak: 30 << 20,
            usable_peak: 34 << 20,
            internal_fragmentation: 4 << 20,
            blowup: 10 << 20,
            external_fragmentation: 20 << 20,
            mapped_peak: 64 << 20,
            requested_end: 2 << 20,
            usable_end: 2 << 20,
            usable_known: true,
        }),
        sites: vec![
            site("make_buffer", 30, 96 << 20, 0),
            site("cache_insert", 77, 8 << 20, 2 << 20),
            SiteEntry {
                via: Some("xmalloc".into()),
                ..site("parse_line", 12, 1 << 20, 0)
            },
        ],
        heap_profile: Some(sample_heap_profile()),
        kernel: sample_kernel(),
    }
}

/// Page faults and `mmap_lock` waits of two threads.
pub fn sample_kernel() -> Vec<KernelThreadEntry> {
    vec![
        KernelThreadEntry {
            tid: 42,
            page_faults: 1000,
            page_faults_in_allocator: 300,
            mmap_lock_waits: 7,
            mmap_lock_wait_ns: 2_000_000,
        },
        KernelThreadEntry {
            tid: 43,
            page_faults: 234,
            page_faults_in_allocator: 0,
            mmap_lock_waits: 5,
            mmap_lock_wait_ns: 1_400_000,
        },
    ]
}

/// The sample report with [`sample_allocator`] in it.
pub fn report_with_allocator() -> Report {
    let mut r = sample_report();
    r.allocator = sample_allocator();
    r
}

/// A waiting site in locks.c (no source file without a line).
pub fn waiter(function: &str, line: Option<u32>, count: u64, wait_ns: u64) -> WaiterSite {
    WaiterSite {
        function: function.into(),
        file: line.map(|_| "/src/locks.c".into()),
        line,
        module: "locks".into(),
        count,
        wait_ns,
        chain: vec![format!(
            "{function} ({})",
            line.map_or("(locks)".to_string(), |l| format!("locks.c:{l}"))
        )],
    }
}

/// A releasing site in locks.c that woke all but 3 of its `count`.
pub fn holder(function: &str, line: u32, count: u64) -> HolderSite {
    HolderSite {
        function: function.into(),
        file: Some("/src/locks.c".into()),
        line: Some(line),
        module: "locks".into(),
        count,
        woken: count - 3,
        delay_caused_ns: count * 20_000,
    }
}

/// A glibc mutex with its owners, a kernel lock, then a condvar, in
/// report order.
pub fn report_with_locks() -> Report {
    let mut r = sample_report();
    let mutex = LockEntry {
        address: LockAddress::At(0x5555_aaaa_0040),
        name: Some("g_hot_lock".into()),
        kind: LockKind::Mutex,
        acquisitions: None,
        contentions: 43_683,
        wait_total_ns: 1_810_000_000,
        wait_mean_ns: 41_000,
        wait_p99_ns: 35_500,
        wait_max_ns: 5_370_000,
        hold_p99_ns: None,
        threads: 2,
        owner_seen: true,
        owners: vec![
            OwnerEntry {
                tid: 24692,
                count: 9,
            },
            OwnerEntry {
                tid: 24700,
                count: 3,
            },
        ],
        waiters: vec![
            waiter("contend_hot", Some(166), 43_000, 1_800_000_000),
            waiter("contend_cold", Some(180), 683, 10_000_000),
        ],
        holders: vec![holder("release_hot", 169, 43_693)],
        ..LockEntry::default()
    };
    let kernel = LockEntry {
        address: LockAddress::Kernel,
        name: Some("kernel rwsem (read)".into()),
        kind: LockKind::Kernel,
        contentions: 12,
        wait_total_ns: 3_400_000,
        wait_mean_ns: 283_000,
        wait_p99_ns: 900_000,
        wait_max_ns: 1_000_000,
        threads: 0,
        owner_seen: false,
        owners: vec![],
        waiters: vec![WaiterSite {
            module: "[kernel]".into(),
            ..waiter("do_user_addr_fault", None, 12, 3_400_000)
        }],
        holders: vec![],
        ..mutex.clone()
    };
    let condvar = LockEntry {
        address: LockAddress::At(0x7f00_dead_be00),
        name: None,
        kind: LockKind::Condvar,
        contentions: 40,
        wait_total_ns: 9_000_000_000,
        wait_mean_ns: 225_000_000,
        wait_p99_ns: 800_000_000,
        wait_max_ns: 900_000_000,
        threads: 4,
        owner_seen: false,
        owners: vec![],
        waiters: vec![waiter("wait_for_work", Some(210), 40, 9_000_000_000)],
        holders: vec![holder("post_work", 230, 41)],
        ..mutex.clone()
    };
    r.locks = vec![mutex, kernel, condvar];
    r
}

pub fn report_with_sharing() -> Report {
    let mut r = sample_report();
    r.sampling.addresses.mode = AddressMode::Decoded;
    r.sampling.addresses.user_samples = 1000;
    r.sampling.addresses.with_address = 970;
    r.sampling.addresses.address_share = 0.97;
    r.false_sharing = vec![false_sharing_entry()];
    r
}

/// The first lock of `r` as the lock uprobes see it: acquisitions, hold
/// times and its one critical section.
pub fn trace_hot_lock(r: &mut Report) {
    let hot = &mut r.locks[0];
    hot.acquisitions = Some(65_880);
    hot.contention_rate = Some(0.6);
    hot.hold_mean_ns = Some(21_800);
    hot.hold_p99_ns = Some(28_500);
    hot.hold_max_ns = Some(4_400_000);
    hot.sections = vec![SectionEntry {
        function: "contend_hot".into(),
        file: Some("/src/locks.c".into()),
        line: Some(166),
        module: "locks".into(),
        released_at: Some("locks.c:169".into()),
        count: 65_880,
        hold_ns: 1_435_000_000,
        hold_max_ns: 4_400_000,
        delay_caused_ns: 1_010_000_000,
    }];
    hot.unnecessary = Some(sample_unnecessary());
}

/// Every part of the report filled: the allocator's, the locks' (one
/// traced in sampled mode), a false-sharing finding and a dismissed line.
pub fn full_report() -> Report {
    let mut r = report_with_allocator();
    r.locks = report_with_locks().locks;
    trace_hot_lock(&mut r);
    r.lock_tracing = Some(LockTracing {
        mode: TraceMode::Sampled,
        library: "/lib/libc.so.6".into(),
        traced_fraction: 0.25,
        acquisitions_error: Some(0.2),
        windows: 7,
        functions: vec!["pthread_mutex_lock".into()],
        always_traced: vec!["pthread_cond_wait".into()],
        sections_lost: 1,
        unmatched_unlocks: 2,
        held_overflow: 3,
    });
    // The governor sampled the futex waits: the top lock's counts are
    // estimates.
    r.lock_contention = Some(super::model::LockContention {
        hooks: "sched".into(),
        stride_max: 4,
        stride: 2,
        waits_traced: 15_000,
        waits_skipped: 45_000,
        slot_collisions: 1,
        waits_as_sections: 120,
        waits_as_sections_lost: 0,
        windows: 0,
        attached_share: 1.0,
    });
    r.locks[0].contention_error = Some(0.05);
    let sharing = report_with_sharing();
    r.sampling.addresses = sharing.sampling.addresses;
    r.false_sharing = sharing.false_sharing;
    r.false_sharing_dismissed = vec![DismissedLine {
        line: "0x1000".into(),
        object: "g_padded+64".into(),
        object_kind: ObjectKind::Global,
        samples: 10,
        writes: 10,
        shared: false,
        reason: DismissReason::OneThread,
    }];
    r.allocator.always_traced = vec![AllocOp::Calloc];
    r.sections.put(Box::new(CacheUse(vec![sample_cache_use()])));
    // A container's process (pid 1 in its namespace) and a second one.
    r.threads[0].ns_tid = Some(1);
    r.threads.push(ThreadEntry {
        tid: 57,
        pid: 57,
        ns_tid: Some(9),
        name: "helper".into(),
        samples: 20,
        created_by: None,
        exited: true,
    });
    r.target.processes = vec![
        ProcessEntry {
            pid: 42,
            ns_pid: Some(1),
            command: "./work 2".into(),
            threads: 1,
            samples: 1000,
        },
        ProcessEntry {
            pid: 57,
            ns_pid: Some(9),
            command: String::new(),
            threads: 1,
            samples: 20,
        },
    ];
    r.notes.push("a note".into());
    r
}

/// An allocation call site in `prog.c`.
fn site_ref(function: &str, line: u32, via: Option<&str>) -> CodeRef {
    CodeRef {
        function: function.into(),
        file: Some("prog.c".into()),
        line: Some(line),
        inlined_into: vec![],
        via: via.map(Into::into),
    }
}

/// The allocator's CPU share, by function and by call site.
fn sample_cpu() -> AllocatorCpu {
    AllocatorCpu {
        samples: 412,
        share: 0.0824,
        functions: vec![
            AllocatorFunctionCpu {
                function: "_int_malloc".into(),
                op: None,
                samples: 250,
                share: 0.05,
            },
            AllocatorFunctionCpu {
                function: "__GI___libc_free".into(),
                op: Some(AllocOp::Free),
                samples: 162,
                share: 0.0324,
            },
        ],
        sites: vec![
            AllocatorSiteCpu {
                site: site_ref("parse_line", 88, Some("xmalloc")),
                samples: 290,
                share: 0.7,
            },
            AllocatorSiteCpu {
                site: site_ref("main", 41, None),
                samples: 100,
                share: 0.24,
            },
        ],
        site_samples: 415,
        sites_unknown: 25,
    }
}
