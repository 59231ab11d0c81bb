// Package lease holds the agent's two uses of coordination.k8s.io Leases:
// the rollout slots that bound how many nodes of a pool are disrupted at
// once (--max-concurrent: Slots, slots.go and queue.go, first come, first
// served, in an order all agents agree on); the node Lease that keeps one
// agent per node across state directories is package nodelease. Both judge expiry as client-go's leader election does: by when this
// agent observed a Lease's record change, never by comparing another
// machine's clock with its own (package leaseobs).
//
// It may import client-go (through internal/kclient), record, journal (the
// one-agent error) and reconcile (the interfaces it implements).
package lease
