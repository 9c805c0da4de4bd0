// Package observer is the RADIC observer: per managed process it owns the safe
// sockets, ships critical data (received bytes, determinants) to the
// process's protector and drives replay after a restart.
//
// Status: planned (DESIGN.md, contracts 4-6, 9); nothing is implemented yet.
package observer
