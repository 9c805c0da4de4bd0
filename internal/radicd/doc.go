// Package radicd is the per-node radic daemon behind cmd/radicd: its
// configuration (flags and a key = value file), the heartbeat ring member
// over UDP, self-fencing of the job cgroup, the critical-data stores of the
// nodes it protects (package msglog) with replication to k protectors over
// HTTP on the --listen address, Prometheus metrics on an explicit registry,
// the /status document read by `radic status`, and the sd_notify protocol
// (READY=1, STOPPING=1, WATCHDOG=1) spoken to systemd or `radic cluster up`.
//
// Network protocol on --listen (TCP, HTTP/1.1; UDP on the same port carries
// the heartbeats):
//
//	POST /v1/log                    records of this node's processes; 204 once all k protectors stored them
//	POST /v1/replica/append?node=N  records of node N, stored here (N's protector); 507 when full
//	GET  /v1/replica/streams?node=N what is held for N (JSON)
//	GET  /v1/replica/read?node=N&owner=O&stream=S&from=F  records, concatenated
//	POST /v1/suspect?node=N         an observer escalates a socket error: probe N now
//	GET  /status, /healthz
//
// Bodies are msglog record encodings (each with its CRC32C), concatenated.
package radicd
