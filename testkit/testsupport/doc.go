// Package testsupport holds what tests of several packages share: a
// discarding logger, simulated GPUs, config helpers and fakes of the
// reconcile core's ports. It is imported by tests only.
package testsupport
