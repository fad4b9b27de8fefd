//! Names of the load-time globals (`EbpfLoader::set_global`).

/// `u32`: the thread-group id (process id) being traced.
pub const TARGET_TGID: &str = "TARGET_TGID";
/// `u32`: 1 to follow the children the traced processes fork.
pub const FOLLOW_CHILDREN: &str = "FOLLOW_CHILDREN";
/// `u32`: offset of `group_dead` in `sched:sched_process_exit`.
pub const EXIT_GROUP_DEAD_OFFSET: &str = "EXIT_GROUP_DEAD_OFFSET";
/// `u32`: offset of `pid` in the `task:task_newtask` record.
pub const NEWTASK_PID_OFFSET: &str = "NEWTASK_PID_OFFSET";
/// `u32`: offset of `clone_flags` in the `task:task_newtask` record.
pub const NEWTASK_FLAGS_OFFSET: &str = "NEWTASK_FLAGS_OFFSET";
/// `u32`: 1 when the allocator keeps glibc's chunk header at `ptr - 8`
/// (then the programs read it for the usable size and class).
pub const ALLOC_GLIBC_HEADER: &str = "ALLOC_GLIBC_HEADER";
/// `u32`: offset of the first argument in `syscalls:sys_enter_*`
/// records (arguments follow, 8 bytes each).
pub const SYSCALL_ARGS_OFFSET: &str = "SYSCALL_ARGS_OFFSET";
/// `u32`: offset of `ret` in `syscalls:sys_exit_*` records.
pub const SYSCALL_RET_OFFSET: &str = "SYSCALL_RET_OFFSET";
/// `u64`: the kernel's tick handler, whose hrtimer expiries the tick
/// sampler samples on.
pub const TICK_FUNCTION: &str = "TICK_FUNCTION";
/// `u32`: offset of `function` in the `timer:hrtimer_expire_entry` record.
pub const TICK_FUNCTION_OFFSET: &str = "TICK_FUNCTION_OFFSET";
