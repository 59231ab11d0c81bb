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
	// NodeHistoryMaxRecords is how many records the history on the Node
	// keeps, newest first: the newest few at a glance, the whole bounded
	// history (HistoryMaxRecords) in the history ConfigMap.
	NodeHistoryMaxRecords = 4
	// NodeHistoryReason bounds the reason of a record of the history on
	// the Node, in bytes.
	NodeHistoryReason = 256
	// MaxNodeRecordBytes is the most a record of the history on the Node
	// encodes to: NodeHistoryMaxRecords of them fit in NodeHistoryMaxBytes,
	// so the Node's light history drops a record only by its count.
	MaxNodeRecordBytes = NodeHistoryMaxBytes/NodeHistoryMaxRecords - 16
	// NodeHistoryMaxBytes bounds the light history on the Node (the
	// history annotation's value, in bytes) whatever its records hold
	// (names of 253 bytes included); records of a usual size take about
	// 550 bytes each. A history the Node keeps whole, while the ConfigMap
	// cannot be written, is bounded by HistoryMaxBytes.
	NodeHistoryMaxBytes = 6 << 10
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
// whole record: what a change was, how it ended and who asked, at a glance
// (docs/reference.md, "On the Node"): config, previousConfig, result,
// reason (cut to NodeHistoryReason), startedAt, finishedAt, gpusChanged,
// gpusUntouched, the evicted pods counted (evictedPodCount;
// evictedPodsOmitted, none named), reboot, configHash, requestedBy,
// requestedVia, requestedBySource, requestedAt, and fullRecord set to ref.
// Within MaxNodeRecordBytes. An empty ref leaves r whole (Bounded).
func (r ChangeRecord) InNodeHistory(ref string) ChangeRecord {
	r = r.Bounded()
	if ref == "" {
		return r
	}
	r.cutPods(0)
	r.Reason = BoundText(r.Reason, NodeHistoryReason)
	r.Geometry, r.GPUsUnusable, r.PreviousConfigHash = nil, nil, ""
	r.ResourcesConverged, r.AffectedBy, r.ServedBy = nil, "", ""
	r.DisruptedAt, r.AgentVersion, r.DriverVersion, r.ConfigSource = nil, "", "", ""
	r.FullRecord = ref
	// Each free-text field within its share (a label value is at most 63
	// bytes, a digest fits), so that an entry stays within
	// MaxNodeRecordBytes whatever they hold; the whole texts are in the
	// whole record.
	for f, limit := range map[*string]int{&r.Config: 64, &r.PreviousConfig: 64, &r.ConfigHash: 80,
		&r.RequestedBy: 128, &r.RequestedVia: 64, &r.RequestedBySource: 32} {
		*f = BoundText(*f, limit)
	}
	// The longest texts of all: the reason and the requester make room.
	if r.nodeSize() > MaxNodeRecordBytes {
		r.Reason = BoundText(r.Reason, 64)
		r.RequestedBy = BoundText(r.RequestedBy, 64)
	}
	return r
}

// lightEntry is the JSON of a light entry of the history on the Node: the
// record without the fields InNodeHistory leaves out, rather than with
// them empty (the outer fields, always empty, hide the record's).
type lightEntry struct {
	ChangeRecord
	AgentVersion  string `json:"agentVersion,omitempty"`
	DriverVersion string `json:"driverVersion,omitempty"`
	ConfigSource  string `json:"configSource,omitempty"`
}

// NodeEntryJSON encodes r as an entry of the history on the Node: in the
// light form when r is one (InNodeHistory with a ref: FullRecord set),
// else whole.
func (r ChangeRecord) NodeEntryJSON() ([]byte, error) {
	if r.FullRecord == "" {
		return json.Marshal(r)
	}
	return json.Marshal(lightEntry{ChangeRecord: r})
}

// nodeSize is the size of r's JSON as a history entry on the Node, in
// bytes.
func (r ChangeRecord) nodeSize() int {
	b, _ := r.NodeEntryJSON()
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
