// Package profiles names MIG profiles and describes what one GPU offers.
//
// It parses and prints profile names ("1g.18gb", "1g.18gb+me",
// "1c.3g.40gb", "1g.24gb-me", "1g.24gb+me.all"), computes a profile's name
// from its memory the way NVIDIA's go-nvlib does, and holds the catalogue
// types (GPU instance profiles with ids, max counts and placements) plus the
// static tables of known GPU models. It does no I/O.
package profiles
