package kube

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/configmap"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// The whole history off the Node: the ConfigMap <node>-mig-history in the
// agent's namespace holds the newest change records whole
// (configMapHistory's bound) (the pods they evicted, all named; the geometry; the whole
// reason), newest first, while the Node's annotations hold them in their
// light form (record.OnNode, record.InNodeHistory). Owned by the Node as
// <node>-mig-config is: it lives as long as the Node's annotations do.
// Only the node's own agent may write or delete it (the admission policy
// mig-agent-history), so a record there is as hard to forge or erase as
// one on the Node.

// wholeKept is where a change's whole record went: ref
// (record.FullRecordRef, "" when it could not be written), the records the
// ConfigMap's bound dropped, and the keys (published.RecordKey) of those
// it holds.
type wholeKept struct {
	ref     string
	dropped []json.RawMessage
	held    map[string]bool
}

// keepWhole puts rec at the head of the history ConfigMap, retried through
// an API server outage. Where it could not be written (logged, with a
// Warning Event) the ref is "": the Node then keeps the record whole.
func (k *Cluster) keepWhole(ctx context.Context, rec record.ChangeRecord) wholeKept {
	if k.Namespace == "" {
		return wholeKept{}
	}
	var w wholeKept
	err := k.retry(ctx, func() error {
		var err error
		w.dropped, w.held, err = k.saveWhole(ctx, rec)
		return err
	})
	if err != nil {
		name := record.HistoryConfigMapName(k.Node)
		k.log().Warn("the whole change record could not be kept in the history ConfigMap; the Node keeps it whole",
			"configMap", name, "namespace", k.Namespace, "err", err)
		k.warn(ctx, nil, record.ReasonHistoryUnwritable, fmt.Sprintf(
			"the %s record of config %q could not be written to ConfigMap %s/%s (%v); the Node's annotations keep it whole",
			rec.Result, rec.Config, k.Namespace, name, err))
		return wholeKept{}
	}
	w.ref = record.FullRecordRef(k.Namespace, k.Node)
	return w
}

// saveWhole writes rec at the head of the history ConfigMap (created when
// missing: owned by the Node, and started with the records of the Node's
// history, which an agent of before kept only there), within
// configMapHistory's bound, and returns the records the bound dropped and
// the keys of those it holds. A history that is not a JSON array is kept
// aside under record.HistoryConfigMapUnparsableKey. It saves through
// configmap.Save, under its conflict rule.
func (k *Cluster) saveWhole(ctx context.Context, rec record.ChangeRecord) ([]json.RawMessage, map[string]bool, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, nil, err
	}
	name := record.HistoryConfigMapName(k.Node)
	var dropped []json.RawMessage
	var held map[string]bool
	_, err = configmap.Save(ctx, k.Client.CoreV1().ConfigMaps(k.Namespace), name, nil, func(cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
		var entries []json.RawMessage
		if cm == nil {
			node, err := k.CachedNode(ctx)
			if err != nil {
				return nil, err
			}
			cm = newHistory(k.Namespace, k.Node, node)
			for _, e := range nodeHistory(node) {
				if _, err := record.Decode(e); err == nil {
					entries = append(entries, e)
				}
			}
		} else {
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			var err error
			if entries, err = record.SplitHistory(cm.Data[record.HistoryConfigMapKey]); err != nil {
				k.log().Warn("the history in the ConfigMap is not a JSON array; keeping it aside", "configMap", name,
					"keptIn", record.HistoryConfigMapUnparsableKey)
				cm.Data[record.HistoryConfigMapUnparsableKey] = cm.Data[record.HistoryConfigMapKey]
				entries = nil
			}
		}
		var hist []byte
		hist, held, dropped = headOf(raw, entries)
		cm.Data[record.HistoryConfigMapKey] = string(hist)
		return cm, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return dropped, held, nil
}

// newHistory is an empty history ConfigMap of node, owned by it.
func newHistory(namespace, nodeName string, node *corev1.Node) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: record.HistoryConfigMapName(nodeName), Namespace: namespace,
			Labels:          map[string]string{record.LabelManagedBy: "mig-agent", record.LabelNode: nodeName},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
		Data: map[string]string{},
	}
}

// nodeHistory is the entries of node's history annotation (none when it
// does not parse).
func nodeHistory(node *corev1.Node) []json.RawMessage {
	if node == nil {
		return nil
	}
	entries, _ := record.SplitHistory(node.Annotations[record.AnnotationHistory])
	return entries
}

// headOf puts raw at the head of entries, keeps what configMapHistory's
// bound keeps and returns them as JSON, with their keys (published.RecordKey) and
// those dropped (oldest last).
func headOf(raw json.RawMessage, entries []json.RawMessage) ([]byte, map[string]bool, []json.RawMessage) {
	hist, dropped := configMapHistory("").keep(append([]json.RawMessage{raw}, entries...))
	out, _ := json.Marshal(hist)
	held := map[string]bool{}
	for _, e := range hist {
		if r, err := record.Decode(e); err == nil {
			held[published.RecordKey(r)] = true
		}
	}
	return out, held, dropped
}
