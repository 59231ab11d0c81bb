// Package kube is the Kubernetes side of the agent, behind the reconcile
// core's interfaces: the watch of its Node and the snapshot the core sees
// (Cluster, kube.go), the writing of a change record on the Node, whole
// (record.go: bounded, patched with its history, retried, the records the
// history drops named), the requester of a change (requester.go), Events,
// the rights check before a change (preflight.go), other MIG managers
// (othermanager.go), and the status a person reads (status.go; as text,
// status_text.go). The pods a change disturbs are package drain's
// (drain.Disruptor); the Leases (rollout slots, the node Lease) are package
// lease's.
//
// It may import client-go (through internal/kclient), drain, record,
// gpus (the inventory) and reconcile (the interfaces it implements).
package kube
