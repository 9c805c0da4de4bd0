// Package checkpoint holds the checkpoint backends (exec, criu) behind one interface
// and the semi-coordinated per-node checkpoint protocol.
//
// Status: planned (DESIGN.md, contract 7; notes/checkpoint.md); nothing is
// implemented yet.
package checkpoint
