// Package protector is the RADIC protector: per node it stores the critical data of
// the observers it protects, restarts them when their node fails and
// re-protects them after recovery.
//
// Status: planned (DESIGN.md, contract 9); nothing is implemented yet.
package protector
