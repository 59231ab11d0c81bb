// Package gpus applies a plan to this host's GPUs: it reads them
// (Discover: the Inventory), looks a config up in the config file or the
// generated set (Lookup), says what a plan takes away (takes.go: the GPUs,
// MIG devices, pods and processes a change disturbs, one source for the
// drain step, the stray-process check, ApplyPlan and the dry run), applies
// it step by step (ApplyPlan, ApplyAndVerify), exports the geometry, and
// runs nvidia-mig-parted's hooks around a change.
//
// It may import nvmlx, geometry and profiles; nothing of Kubernetes.
package gpus
