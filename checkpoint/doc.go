// Package checkpoint holds the checkpoint backends behind one interface,
// [Backend], used by radicd for the semi-coordinated checkpoints of
// DESIGN.md contract 7: all processes of one node (its [Group]) are
// checkpointed together, as one consistent cut, so traffic between them
// needs no logging, and a complete image lets the log before it be dropped.
//
// Backends:
//
//   - exec (package checkpoint/reexec): the "image" is the group's launch
//     records; restore re-executes them through radicd's launcher and
//     replays the whole log. Works everywhere; the log only grows.
//   - criu (package checkpoint/criu): real images taken by CRIU 4.1, kept
//     in the format of package checkpoint/image (compressed, checksummed,
//     a manifest written last, incremental against the previous image),
//     restored with `criu restore --tcp-close` after checking that the
//     image's pids are free. Usable only where CRIU runs (see its package
//     doc); [Choose] falls back to exec and says why.
//
// Nothing here launches ranks or talks to protectors: radicd does (see
// ARCHITECTURE.md, "Checkpoints").
package checkpoint
