// Package radicd is the per-node radic daemon behind cmd/radicd: its
// configuration (flags and a key = value file), the heartbeat ring member
// over UDP, self-fencing of the job cgroup, the critical-data stores of the
// nodes it protects (package msglog) with replication to k protectors over
// HTTP on the --listen address, the location table (package reconfigure)
// served to the shim and shared with the other daemons, Prometheus metrics
// on an explicit registry, the /status document read by `radic status`, and
// the sd_notify protocol (READY=1, STOPPING=1, WATCHDOG=1) spoken to systemd
// or `radic cluster up`.
//
// Network protocol on --listen (TCP, HTTP/1.1; UDP on the same port carries
// the heartbeats):
//
//	POST /v1/log                    records of this node's processes; 204 once all k protectors stored them
//	POST /v1/replica/append?node=N  records of node N, stored here (N's protector); 507 when full
//	GET  /v1/replica/streams?node=N what is held for N (JSON)
//	GET  /v1/replica/read?node=N&owner=O&stream=S&from=F  records, concatenated
//	POST /v1/replica/adopt?node=N&group=G&owner=O&from=H  store under N owner O's streams of G's store on H (a restarted rank's log); {"records": n}
//	POST /v1/suspect?node=N         an observer escalates a socket error: probe N now
//	GET  /v1/nodes                  every node: logical address, current address, generation
//	POST /v1/nodes/moved            a node announces its new address {"id","addr","gen"}
//	POST /v1/listeners              register a radic listener of this node {"job","port","lpid","ctl_port"}; pushed to every daemon before the 204
//	DELETE /v1/listeners            unregister it (pushed too)
//	POST|DELETE /v1/listeners?from=N  a push from node N's daemon
//	GET  /v1/locate?job=J&addr=IP:PORT[&local=1]  is it a radic listener, and where is it now
//	POST /v1/jobs/J/ranks           launch a rank of job J: a launch record {"version","job","rank","size","node","path","argv","env","cwd","stdin","merge_stderr"};
//	                                stored with the protectors, then created held at its gate; 201 {"pid","start","protectors"}
//	POST /v1/jobs/J/ranks?instead-of=N  the same, in place of node N lost during the launch (once the ring declared it dead; 409: N had created it)
//	GET  /v1/jobs/J/guests          {"guests": [node ids]}: the logical nodes of J's ranks running here that are not this node's (restarted or launched here in their place)
//	POST /v1/jobs/J/ranks/R/start   let it run; 422 with the reason when the exec failed
//	GET  /v1/jobs/J/ranks/R[?wait=D]  {"state": held|running|exited, "exit": {"code","signal"}, "pid", ...}; with wait, once exited or after D
//	GET  /v1/jobs/J/ranks/R/output?stream=stdout|stderr&from=F[&wait=D]  its bytes from offset F (those before F are released);
//	                                X-Radic-Offset: F, X-Radic-Eof: 1 when the body ends the stream; 416 when F was released or is beyond the end
//	POST /v1/jobs/J/ranks/R/signal?sig=TERM|KILL|INT|HUP|CONT|STOP  to its process group
//	POST /v1/jobs/J/ranks/R/stdin   the body becomes its stdin (launched with "stdin": true), closed at the body's end
//	DELETE /v1/jobs/J               the launcher is done: ranks still there are killed, all are forgotten
//	GET  /v1/jobs                   every rank of this node (JSON)
//	POST /v1/jobs/J/checkpoint      one checkpoint of J's ranks here, together, left running (CheckpointReply; 404: none here, 409: one not running)
//	POST /v1/recovery/learn         a protector.Placement announced by another daemon's machine (and the group's replay report)
//	POST /v1/recovery/restart       {"group","epoch","from"}: relaunch the group's recovery ranks here; 204 once running
//	POST /v1/recovery/abort         {"group","epoch"}: never start that attempt (kill it if it started)
//	POST /v1/recovery/ranks         [launch.RankLoc]: where recovery ranks run now (pushed to every daemon)
//	GET  /v1/recovery/jobs/J        launch.JobRecovery: where each rank of J runs now (node, epoch) and the recoveries
//	DELETE /v1/recovery/jobs/J      J ended: never restart its ranks
//	POST /v1/recovery/events        a launch.RecoveryEvent (pushed to every daemon)
//	POST /v1/recovery/progress      {"by","list"}: the recoveries node "by" drives, as they stand (pushed to every daemon; progress.go)
//	POST /v1/recovery/replay        {"group","epoch","node","bytes","total","done"}: replay progress of a restarted group, from its new host
//	POST /v1/recovery/divergence    launch.Divergence: radic run saw a restarted rank's output differ (radic_divergences_total)
//	GET  /status, /healthz
//
// Store bodies are msglog record encodings (each with its CRC32C),
// concatenated; location bodies are the JSON types of package reconfigure;
// launch bodies are those of package internal/launch. An unknown job or
// rank is a 404 that names the node, a bad program a 422 that names the
// path.
//
// # Ranks
//
// radicd launches its node's ranks, so that it owns their processes (its
// protector restarts them, issue 10). A launch record is stored with the
// node's k protectors, as a msglog record of kind launch under owner
// 2^64-1 (package internal/launch says why that cannot collide with a
// process's data), before the process exists; then the rank is created
// by this binary's `nsexec` helper (package internal/cluster/proc) in the
// job cgroup (--job-cgroup, which fencing kills) and held at its gate, so
// that the launcher can record its pid before it runs; Start opens the
// gate. radicd already runs in the node's network namespace. A rank's
// stdout and stderr are pipes read into windows of 4 MiB each (package
// internal/launch/outbuf): the launcher's next offset releases what it
// has, and a rank whose window is full waits, so a launcher that loses its
// connection asks again from its last offset and nothing is lost. A rank
// never started is ended after 30 s; an exited rank's status and output
// are kept 10 min for a launcher that does not come back.
//
// # Recovery
//
// With --fence-kill, radicd runs its node's protector.Machine (recovery.go;
// the state machine is package protector): the ring's View, suspicions and
// declarations go in, placements go to every daemon, and its actions are
// executed. A group is the ranks one node launched (GroupID = that node);
// the ranks of jobs launched with RADIC_RECOVERY=1 are relaunched from
// their launch records, read from the group's protectors, on the spare
// the machine picks (a node's death) or in place (a rank killed by a
// signal its launcher did not send). An ActRestart's target reports the
// group Started, Reconnected and Live at once: replay is not built yet. A
// rank's output is per instance (RankStatus.Epoch, X-Radic-Epoch, ?epoch=).
// Without --fence-kill nothing is restarted, as a frozen node's ranks could
// still run.
//
// # The location table
//
// Every daemon holds the whole table; there is no central component. A
// registration is pushed by the listener's node to every other daemon
// before it is acknowledged, so lookups are answered locally; a lookup that
// misses for an address of a cluster node asks that node's daemon (with
// local=1, so that it does not recurse) and caches a hit, and one for an
// address outside the cluster is answered at once (503 when the node's
// daemon cannot be asked: the answer is unknown, not "unmanaged").
//
// With --bind 0.0.0.0, radicd's sockets outlive its node's address: it
// follows the address of the interface that holds the --listen address
// (netlink events, and a poll every 200 ms), and on a change moves its node
// in the table with the next generation (kept in STATE-DIR/address) and
// announces it to every daemon (POST /v1/nodes/moved, retried for 10 s).
// A daemon that missed the announcement learns the move from the node's
// heartbeats, which come from the new address (hbudp reports the source;
// the daemon asks the node's daemon there), or from the node list of
// another daemon, compared round robin every 2 s. Two nodes that move at
// about the same time both announce to, and heartbeat, the address the
// other had, and no addressed datagram can reach either again; so for 10 s
// after a move a node's heartbeats also go out of its interface to the
// limited broadcast address (hbudp's beacon), which reaches every node on
// the segment whatever its address. Heartbeats to a moved node
// follow it, so a readdress is not a failure: nobody is declared dead and
// the node does not fence itself.
package radicd
