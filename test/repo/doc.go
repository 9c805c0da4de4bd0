// Package repo holds checks on the repository as a whole: every package
// documents itself, and the layering rules of DESIGN.md hold.
package repo
