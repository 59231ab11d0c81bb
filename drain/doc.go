// Package drain moves workloads out of the way of a MIG change (docs/reference.md#disruption-and-reboot):
// it learns which pod holds which GPU or MIG device from the kubelet
// PodResources API, picks exactly the pods whose devices a change takes away
// (or, when PodResources cannot be read, every pod of the node that requests
// an nvidia.com/ resource), evicts them through the Eviction API so that
// PodDisruptionBudgets hold, taints the node while the change runs, pauses
// and restores the GPU Operator's operands, and waits for the device plugin
// to advertise the new resources.
//
// Every step is safe to repeat, and what a step changed is returned in a
// form the caller can journal (Saved, the added flag of AddTaint) so that a
// restarted agent undoes exactly that and nothing else.
//
// It imports client-go and the kubelet API only; it knows nothing of the
// agent, NVML or the geometry.
package drain
