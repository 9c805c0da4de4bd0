// Package reconfigure is the location table (RADIC's "Socketable"): for
// every node of the cluster, its logical address (the first address it had,
// the only one applications ever see) to its current address and
// generation, and the radic listeners of every job (job, node, port) with
// the logical process id that owns each and the port of that process's
// control listener.
//
// [Table] is pure: no sockets, no clock, no goroutines; it is safe for
// concurrent use. radicd holds one per node and serves it over HTTP (the
// wire types are in wire.go, so that the shim's Go code and radicd share
// them); the shim's connect, bind, getsockname and getpeername translate
// addresses through it (DESIGN.md, contract 3).
//
// # Generations
//
// A node's address changes only with a higher generation: every move of a
// node bumps its generation, and an update carrying a generation that is
// not above the known one is stale and ignored. Updates may therefore
// arrive in any order, twice, or through several paths (the node's own
// announcement, a peer's table, a locate answer) and every table converges
// to the newest address.
//
// # Addresses
//
// A node is found by its logical address, by its current address, or by an
// address it had before (when no node holds that address now). [Table.Locate]
// is given destination addresses chosen by applications, so a logical
// address wins there; [Table.NodeByAddr] is given addresses seen on the
// wire (a peer's source address), so a current address wins there.
package reconfigure
