// Package kube is the Kubernetes side of the agent, behind the reconcile
// core's interfaces: the watch of its Node and the snapshot the core sees
// (Cluster, kube.go), the writing of a change record on the Node, whole
// (record.go: bounded, patched with its history, retried, the records the
// history drops named; the whole records in the history ConfigMap,
// history.go), the requester of a change (requester.go: who asked is read
// by published.RequesterOf, when the agent first saw it and its log line
// are here), Events, the rights check before a change (preflight.go), and
// other MIG managers (othermanager.go). The status a person reads of a
// node is package published/status's; the reading of what an agent
// publishes (the requester, the whole history) package published's. The
// pods a change disturbs are package drain's (drain.Disruptor); the Leases
// (rollout slots, the node Lease) are package lease's.
//
// It may import client-go (through internal/kclient), drain, record,
// published (the reading of what it writes), gpus (the inventory) and
// reconcile (the interfaces it implements).
package kube
