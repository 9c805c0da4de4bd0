// Package cluster is radic's virtual cluster on one machine: the test bed
// every later capability is proven on, and a product feature users try
// radic and rehearse failures with.
//
// Two modes:
//
//	netns (root, the default as root)        loopback (any user)
//	-----------------------------------      -------------------------------
//	node = network namespace NAME-nID        node = address 127.77.0.(ID+1)
//	       veth NAME-vID on bridge NAME-br          (all of 127/8 is local)
//	       address 10.77.0.(ID+1)/16
//	       cgroup .../radic/NAME/nID/{daemon,job}   process groups, by pid
//	host   10.77.255.254/16 on the bridge
//
// The nodes have no default route: their traffic stays on the bridge, and
// the host reaches them (for example to scrape metrics) through its address
// on the bridge.
//
// Everything a cluster creates (namespace, link, nft table, cgroup, process,
// fault timer) is written to the state file, state.json in the state
// directory, before it is created, so that Down removes it all even after a
// crash of the program that created it; Down is idempotent.
//
// Faults (fault.go) act on a node: kill-node (cgroup.kill and link down),
// kill-rank (SIGKILL one rank), cut-link (veth down), partition (nftables
// drop rules in a bridge-family table radic_NAME), freeze
// (cgroup.freeze) and readdress (a new address; the first one stays the
// node's logical address). Faults with a duration are undone by a detached
// `radic fault-timer` process, recorded in the state, so that they heal even
// when the radic that injected them has exited.
package cluster
