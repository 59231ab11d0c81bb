// Package drain moves workloads out of the way of a MIG change (docs/reference.md#disruption-and-reboot):
// Disruptor is the agent's reconcile.Disruptor. It learns which pod holds
// which GPU or MIG device from the kubelet PodResources API, picks exactly
// the pods whose devices a change takes away (affected.go holds the whole
// rule), evicts them through the Eviction API so that PodDisruptionBudgets
// hold, taints the node while the change runs, pauses and restores the GPU
// Operator's operands, restarts the device plugin and waits for the node
// to advertise the new devices (its allocatable, or the DRA driver's
// ResourceSlices).
//
// Every step is safe to repeat. Hold (the taint, the operands paused) and
// Release (their undoing) record what each step changed in the journaled
// change (the added flag of the taint, the operand labels read before
// pausing) and run each step through the core's step callback, which
// journals the change after it, so that a restarted agent undoes exactly
// that and nothing else.
//
// It learns which pod holds which device through drain/podresources (the
// kubelet PodResources API) and which pod is which operand through
// drain/operandsel (a DaemonSet's pod in an operand namespace, matching the
// selectors), and imports client-go, dra, record and
// settings besides; it knows nothing of the reconcile core, NVML or the
// geometry.
package drain
