// The seccomp profile of the containers ContainerRuntime starts: an allow
// list of the system calls ordinary programs make, including the ones
// bubblewrap needs to build the workspace's sandbox inside the container
// (clone and unshare with namespace flags, mount, umount2, pivot_root,
// setns), which the engines' default profiles refuse to a container without
// CAP_SYS_ADMIN. Our containers have no capabilities at all, so these calls
// can only act inside a user namespace the process made itself: the kernel
// checks capabilities against the namespace's owner.
//
// Everything not listed fails: with ENOSYS where the engine takes the
// profile's defaultErrnoRet (Podman 4.3), as an old kernel would, so that
// programs take their fallbacks (new mount tools fall back to mount(2));
// with EPERM on Docker 20.10, which ignores it. Only the native 64-bit
// architecture is named: a 32-bit system call (i386, x32), a long-standing
// source of kernel bugs, kills the process (SIGSYS, from the runtime).

/**
 * Calls left out, each with why (kept here so that the allow list below
 * stays a decision, not an accident). Any call in neither list is refused.
 */
export const REFUSED_SYSCALLS: Readonly<Record<string, string>> = {
  // The kernel itself and the machine.
  init_module: "loads kernel code",
  finit_module: "loads kernel code",
  delete_module: "unloads kernel code",
  kexec_load: "replaces the kernel",
  kexec_file_load: "replaces the kernel",
  reboot: "the machine's state",
  swapon: "the machine's state",
  swapoff: "the machine's state",
  acct: "the machine's state",
  settimeofday: "the host's clock (time has no namespace)",
  clock_settime: "the host's clock",
  clock_adjtime: "the host's clock",
  syslog: "the kernel's log",
  quotactl: "the host's quotas",
  quotactl_fd: "the host's quotas",
  vhangup: "the host's terminals",
  ioperm: "hardware ports",
  iopl: "hardware ports",
  modify_ldt: "a long history of kernel bugs; 16-bit code only",
  lookup_dcookie: "kernel profiling",
  uselib: "obsolete",
  // Kernel state that namespaces do not separate, and large attack surfaces.
  add_key: "the kernel keyring has no namespace",
  request_key: "the kernel keyring has no namespace",
  keyctl: "the kernel keyring has no namespace",
  bpf: "kernel programs",
  perf_event_open: "kernel profiling, a large attack surface",
  userfaultfd: "widens kernel race windows (a common exploit primitive)",
  io_uring_setup: "a large attack surface, outside seccomp's view",
  io_uring_enter: "a large attack surface, outside seccomp's view",
  io_uring_register: "a large attack surface, outside seccomp's view",
  fanotify_init: "watches the whole file system",
  fanotify_mark: "watches the whole file system",
  // Other processes' memory and files; ptrace(2), which debuggers need, stays.
  process_vm_readv: "reads another process's memory",
  process_vm_writev: "writes another process's memory",
  process_madvise: "acts on another process's memory",
  process_mrelease: "acts on another process's memory",
  kcmp: "compares kernel objects of other processes",
  migrate_pages: "moves another process's memory",
  move_pages: "moves another process's memory",
  open_by_handle_at: "opens files by handle, around path checks",
  // The new mount API: bubblewrap uses mount(2); tools that try these first
  // fall back to it on ENOSYS.
  fsopen: "new mount API, not needed",
  fsconfig: "new mount API, not needed",
  fsmount: "new mount API, not needed",
  fspick: "new mount API, not needed",
  move_mount: "new mount API, not needed",
  open_tree: "new mount API, not needed",
  mount_setattr: "new mount API, not needed",
};

/** Calls allowed (Linux 6.12, x86_64 and arm64 names; names an architecture lacks are skipped). */
export const ALLOWED_SYSCALLS: readonly string[] = words(
  `
  access faccessat faccessat2 chdir fchdir getcwd chmod fchmod fchmodat fchmodat2 chown fchown
  fchownat lchown open openat openat2 creat close close_range read readv pread64 preadv preadv2
  write writev pwrite64 pwritev pwritev2 lseek stat fstat lstat newfstatat statx statfs fstatfs
  truncate ftruncate fallocate fadvise64 readahead fsync fdatasync sync syncfs sync_file_range
  link linkat unlink unlinkat symlink symlinkat readlink readlinkat rename renameat renameat2
  mkdir mkdirat rmdir mknod mknodat getdents getdents64 utime utimes utimensat futimesat umask
  flock fcntl dup dup2 dup3 ioctl sendfile splice tee vmsplice copy_file_range name_to_handle_at
  ustat sysfs cachestat getxattr lgetxattr fgetxattr setxattr lsetxattr fsetxattr listxattr
  llistxattr flistxattr removexattr lremovexattr fremovexattr inotify_init inotify_init1
  inotify_add_watch inotify_rm_watch
`,
  `
  brk mmap munmap mremap mprotect madvise mincore msync mlock mlock2 munlock mlockall munlockall
  remap_file_pages membarrier memfd_create memfd_secret pkey_alloc pkey_free pkey_mprotect
  get_mempolicy set_mempolicy set_mempolicy_home_node mbind map_shadow_stack mseal
`,
  `
  clone clone3 fork vfork execve execveat exit exit_group wait4 waitid kill tkill tgkill getpid
  getppid gettid getpgid setpgid getpgrp getsid setsid set_tid_address set_robust_list
  get_robust_list rseq arch_prctl prctl personality seccomp ptrace pidfd_open pidfd_getfd
  pidfd_send_signal getrlimit setrlimit prlimit64 getrusage times sysinfo uname getcpu
  getpriority setpriority ioprio_get ioprio_set sched_yield sched_getaffinity sched_setaffinity
  sched_getattr sched_setattr sched_getparam sched_setparam sched_getscheduler
  sched_setscheduler sched_get_priority_max sched_get_priority_min sched_rr_get_interval
  get_thread_area set_thread_area restart_syscall landlock_create_ruleset landlock_add_rule
  landlock_restrict_self
`,
  // Identity: changing it needs CAP_SETUID/CAP_SETGID, which the container
  // has only inside user namespaces of its own.
  `
  getuid geteuid getgid getegid getresuid getresgid getgroups setuid setgid setreuid setregid
  setresuid setresgid setgroups setfsuid setfsgid capget capset
`,
  // Namespaces and mounts: what bubblewrap (and unshare(1)) build the
  // sandbox with; without capabilities they act only in a user namespace
  // the caller made.
  `
  unshare setns mount umount2 pivot_root chroot sethostname setdomainname
`,
  `
  rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigsuspend rt_sigtimedwait
  rt_sigqueueinfo rt_tgsigqueueinfo sigaltstack signalfd signalfd4 pause alarm nanosleep
  clock_nanosleep clock_gettime clock_getres gettimeofday time adjtimex getitimer setitimer
  timer_create timer_delete timer_gettime timer_settime timer_getoverrun timerfd_create
  timerfd_gettime timerfd_settime
`,
  `
  poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait
  epoll_pwait2 eventfd eventfd2 futex futex_waitv futex_wake futex_wait futex_requeue pipe pipe2
  getrandom io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents
`,
  // Sockets and IPC: the container's own network and IPC namespaces.
  `
  socket socketpair bind listen accept accept4 connect getsockname getpeername getsockopt
  setsockopt sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg shutdown mq_open mq_unlink
  mq_timedsend mq_timedreceive mq_notify mq_getsetattr msgget msgsnd msgrcv msgctl semget semop
  semtimedop semctl shmget shmat shmdt shmctl
`,
);

/** The names in groups of whitespace-separated words (files, memory, processes...). */
function words(...groups: string[]): string[] {
  return groups.flatMap((g) => g.trim().split(/\s+/));
}

/** libseccomp's name of this machine's 64-bit architecture. */
function nativeArchitecture(): string {
  switch (Deno.build.arch) {
    case "x86_64":
      return "SCMP_ARCH_X86_64";
    case "aarch64":
      return "SCMP_ARCH_AARCH64";
  }
}

const ENOSYS = 38;

/**
 * The profile, in the JSON form Docker and Podman take (`seccomp=` in
 * `HostConfig.SecurityOpt`).
 */
export function seccompProfile(): string {
  return JSON.stringify({
    defaultAction: "SCMP_ACT_ERRNO",
    defaultErrnoRet: ENOSYS,
    architectures: [nativeArchitecture()],
    syscalls: [{ names: ALLOWED_SYSCALLS, action: "SCMP_ACT_ALLOW" }],
  });
}
