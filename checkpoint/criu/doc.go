// Package criu is the criu checkpoint backend: real images of a node's
// group of processes, taken and restored by CRIU 4.1.
//
// # Where it runs
//
// CRIU 4.1 comes from Debian 13's packages, unpacked with their own loader
// into /opt/radic/criu by scripts/criu.sh (Debian 12's 3.17 cannot read
// this kernel's vDSO). [Backend.Usable] says why it cannot run when it
// cannot (not root, no criu, `criu check` failing), and callers fall back
// to the exec backend (checkpoint.Choose). Once per backend (radicd makes
// one per node) it runs package hwbp's breakpoint probe and sets CRIU's
// fault-injection knob CRIU_FAULT=130 (no hardware breakpoints: step with
// PTRACE_SYSCALL) on every dump and restore only if breakpoints do not
// trap, or if the probe could not tell.
//
// # Checkpoint
//
// A group is one or more process trees (a node's ranks, each a child of
// radicd). CRIU dumps one tree per run and freezes that tree itself; for
// more than one tree the group is stopped first (SIGSTOP to every process,
// waited for), so that nothing runs between the trees' dumps and the
// image is one consistent cut of the node, then continued (SIGCONT) once
// every dump is done. The stop is visible: a SIGCONT handler runs, and the
// parent (radicd) may see CLD_STOPPED and CLD_CONTINUED. A cgroup freeze
// would be invisible, but CRIU's --freeze-cgroup lasts one run (one tree),
// and a freeze of our own held across CRIU's runs (which must run code in
// the frozen tasks) was not tried. Each tree is dumped with --leave-running and
// --tcp-close (connections are not frozen: the safe sockets' state that
// matters lives in the process's memory, and the shim reconnects after a
// restore); a checkpoint that is not LeaveRunning kills the group only
// once its image is complete. The raw dump is then packed (package
// checkpoint/image) against the parent image: chunks the parent has are
// referenced, not stored again.
//
// CRIU's own incremental dumps (pre-dump, --track-mem) need the kernel's
// soft-dirty page tracking; this project's kernels lack it (`criu check
// --feature mem_dirty_track` fails), so the backend reports it
// ([Backend.MemTrack]) and does not use it yet: the chunk dedup against
// the parent is the incremental step, and it is what the transfer to the
// protectors needs (only the new pack travels).
//
// # Restore
//
// The image's manifest is read and every chunk checked while the files
// are extracted; the image's pids and thread ids must be free (CRIU
// restores them as they were): those the manifest lists and those in
// CRIU's own pstree.img are checked before CRIU runs, and a clash is
// reported as a checkpoint.PidsInUseError naming the holders. Then one
// `criu restore -d --tcp-close --manage-cgroups=ignore` per tree, started
// directly in the target cgroup (clone3 CLONE_INTO_CGROUP, so the restored
// processes are created there) and, if asked, in the target network
// namespace (nsenter); a group stopped for its dump is continued once
// every tree is back. The restored roots are detached: their parent is
// the nearest child subreaper (radicd should be one) or init.
package criu
