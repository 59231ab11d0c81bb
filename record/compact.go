package record

import (
	"encoding/json"
	"fmt"
)

// The Node's light form of a record. A Node is read whole by every Node
// watcher of the cluster (the scheduler, CNI agents, autoscalers) on every
// update of it, so the annotations there name what a change did and who
// asked, with its long lists and long texts cut; the whole record lives in
// the node's history ConfigMap (HistoryConfigMapName), and each cut record
// on the Node says so (FullRecord).

// The history ConfigMap: <node>-mig-history in the agent's namespace, key
// HistoryConfigMapKey, a JSON array of whole (Bounded) records, newest
// first, at most HistoryMaxRecords: the same records as the history on the
// Node, whole.
const (
	HistoryConfigMapSuffix = "-mig-history"
	HistoryConfigMapKey    = "history.json"
	// HistoryConfigMapUnparsableKey keeps a history of the ConfigMap that
	// was not a JSON array when the next record was written.
	HistoryConfigMapUnparsableKey = "history-unparsable.json"
)

// Bounds of the records on the Node (OnNode, InNodeHistory).
const (
	// NodeLastChangePodBytes is how much the evicted pods' names may take
	// in the last change on the Node (their JSON, in bytes): about 30 pods
	// of a usual name length, a whole GPU's or two of MIG devices.
	NodeLastChangePodBytes = 2 << 10
	// NodeHistoryPodBytes is the same for each record of the history on
	// the Node: the first few pods (about four of a usual name length, so
	// a change that evicts a few names them all there, as every record
	// does), the rest counted; the history ConfigMap names them all.
	NodeHistoryPodBytes = 320
	// NodeHistoryReason bounds the reason of a record of the history on
	// the Node, in bytes.
	NodeHistoryReason = 256
	// MaxNodeRecordBytes is the most a record of the history on the Node
	// encodes to: HistoryMaxRecords of them fit in HistoryMaxBytes, so the
	// Node's history drops a record only by its count, as the ConfigMap's.
	MaxNodeRecordBytes = HistoryMaxBytes/HistoryMaxRecords - 16
)

// ConfigsConfigMapName is the name of the ConfigMap where node's agent
// publishes its generated configs (key ConfigMapKey) and its GPUs
// (annotation AnnotationGPUs).
func ConfigsConfigMapName(node string) string { return node + "-mig-config" }

// HistoryConfigMapName is the name of node's history ConfigMap.
func HistoryConfigMapName(node string) string { return node + HistoryConfigMapSuffix }

// FullRecordRef is the value of FullRecord for the history ConfigMap of
// node in namespace: "ConfigMap <namespace>/<node>-mig-history".
func FullRecordRef(namespace, node string) string {
	return fmt.Sprintf("ConfigMap %s/%s", namespace, HistoryConfigMapName(node))
}

// OnNode is the last change as the Node holds it when ref (FullRecordRef)
// holds the whole record: r (Bounded) with the names of its evicted pods
// cut to NodeLastChangePodBytes, counted in evictedPodCount and
// evictedPodsOmitted, and fullRecord set to ref when anything was cut. An
// empty ref (no ConfigMap holds the record) leaves r whole.
func (r ChangeRecord) OnNode(ref string) ChangeRecord {
	r = r.Bounded()
	if ref == "" {
		return r
	}
	cut := r.cutPods(NodeLastChangePodBytes)
	if cut {
		r.FullRecord = ref
	}
	return r
}

// InNodeHistory is an entry of the history on the Node when ref holds the
// whole record: the fields every record has (docs/reference.md), the
// evicted pods cut to NodeHistoryPodBytes and counted, the reason to
// NodeHistoryReason, no geometry and none of the details only the whole
// record needs; fullRecord set to ref. Within MaxNodeRecordBytes. An empty
// ref leaves r whole (Bounded).
func (r ChangeRecord) InNodeHistory(ref string) ChangeRecord {
	r = r.Bounded()
	if ref == "" {
		return r
	}
	r.cutPods(NodeHistoryPodBytes)
	r.Reason = BoundText(r.Reason, NodeHistoryReason)
	r.Geometry, r.GPUsUnusable, r.PreviousConfigHash = nil, nil, ""
	r.ResourcesConverged, r.AffectedBy, r.ServedBy = nil, "", ""
	r.FullRecord = ref
	// Each free-text field within its share (a label value is at most 63
	// bytes, a digest with its file name fits), so that an entry stays
	// within MaxNodeRecordBytes whatever they hold; the whole texts are in
	// the whole record.
	for f, limit := range map[*string]int{&r.Config: 64, &r.PreviousConfig: 64, &r.ConfigSource: 128, &r.ConfigHash: 128,
		&r.AgentVersion: 64, &r.DriverVersion: 64, &r.RequestedBy: 128, &r.RequestedVia: 64, &r.RequestedBySource: 32} {
		*f = BoundText(*f, limit)
	}
	// The longest names of all: the pods and the reason make room.
	if r.nodeSize() > MaxNodeRecordBytes {
		r.cutPods(2)
		r.Reason = BoundText(r.Reason, 64)
	}
	return r
}

// nodeSize is the size of r's JSON, in bytes.
func (r ChangeRecord) nodeSize() int {
	b, _ := json.Marshal(r)
	return len(b)
}

// cutPods names only the evicted pods within limit bytes of JSON; those
// left out are counted. It reports whether any was.
func (r *ChangeRecord) cutPods(limit int) bool {
	if r.EvictedPods == nil {
		return false
	}
	var cut int
	r.EvictedPods, cut = capPods(r.EvictedPods, limit)
	r.EvictedPodsOmitted += cut
	return r.EvictedPodsOmitted > 0
}

// capPods is the start of pods (each within MaxRecordPod) whose JSON
// array takes at most limit bytes, and how many it leaves out.
func capPods(pods []string, limit int) ([]string, int) {
	out, size := []string{}, 2 // []
	for i, p := range pods {
		p = BoundText(p, MaxRecordPod)
		if size += len(p) + 3; size > limit { // "p",
			return out, len(pods) - i
		}
		out = append(out, p)
	}
	return out, 0
}
