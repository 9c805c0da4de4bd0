// Package netsim emulates the Blue Gene networks the daemons talk over: the 3D torus
// (240-byte packets, routing) and the collective tree (256-byte packets), with
// links over UDP between real nodes or in memory for large simulated machines.
//
// Status: planned; nothing is implemented yet.
package netsim
