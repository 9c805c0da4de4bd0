// Package reconfigure is the location table (RADIC's "Socketable"): logical address
// to current address and epoch, and the address virtualization that bind,
// connect, getsockname and getpeername go through.
//
// Status: planned (DESIGN.md, contract 3); nothing is implemented yet.
package reconfigure
