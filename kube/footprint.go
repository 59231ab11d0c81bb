package kube

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/record"
)

// Footprint is what the agent's records add to its Node, in bytes: the
// record annotations (record.RecordAnnotations, keys and values, as
// Kubernetes counts annotations) and the condition MIGConfigReady (its
// JSON). Every Node watcher of the cluster receives them with each update
// of the Node (`make bench` reports it after 20 changes).
func Footprint(node *corev1.Node) int {
	total := 0
	for _, key := range record.RecordAnnotations {
		if v, ok := node.Annotations[key]; ok {
			total += len(key) + len(v)
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type == record.ConditionConfigReady {
			b, _ := json.Marshal(c)
			total += len(b)
		}
	}
	return total
}
