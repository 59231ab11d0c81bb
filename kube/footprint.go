package kube

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/record"
)

// AnnotationBudget is the most the agent's annotations on its Node weigh
// after 20 changes of a usual size (AnnotationBytes; docs/reference.md):
// the light last change and the newest record.NodeHistoryMaxRecords light
// history entries. `make bench` measures it against the real API server.
const AnnotationBudget = 4 << 10

// AnnotationBytes is what the agent's annotations weigh on its Node, in
// bytes: the record annotations (record.RecordAnnotations), keys and
// values, as Kubernetes counts annotations.
func AnnotationBytes(node *corev1.Node) int {
	total := 0
	for _, key := range record.RecordAnnotations {
		if v, ok := node.Annotations[key]; ok {
			total += len(key) + len(v)
		}
	}
	return total
}

// Footprint is what the agent's records add to its Node, in bytes: its
// annotations (AnnotationBytes) and the condition MIGConfigReady (its
// JSON). Every Node watcher of the cluster receives them with each update
// of the Node (`make bench` reports it after 20 changes).
func Footprint(node *corev1.Node) int {
	total := AnnotationBytes(node)
	for _, c := range node.Status.Conditions {
		if c.Type == record.ConditionConfigReady {
			b, _ := json.Marshal(c)
			total += len(b)
		}
	}
	return total
}
