package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/internal/text"
)

// ReasonRecordRetired is the Event reason of a record that the history
// bound dropped from migagent.io/history.
const ReasonRecordRetired = "MigRecordRetired"

// retire logs a record dropped from the history, whole, and posts a Normal
// Event that names it.
func (k *Kube) retire(ctx context.Context, node *corev1.Node, raw json.RawMessage) {
	k.log().Info("change record dropped from the history by its bound; kept in this log",
		"annotation", AnnotationHistory, "maxRecords", HistoryMaxRecords, "maxBytes", HistoryMaxBytes, "record", string(raw))
	if err := k.Event(context.WithoutCancel(ctx), node, corev1.EventTypeNormal, ReasonRecordRetired, retiredMessage(raw)); err != nil {
		k.log().Warn("posting an event failed", "reason", ReasonRecordRetired, "err", err)
	}
}

// retiredMessage names a dropped record in an Event: its config, result,
// times and requester (the whole record is in the agent's log).
func retiredMessage(raw json.RawMessage) string {
	var r ChangeRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Sprintf("a record that was not valid JSON left %s (the history keeps %d records, %d bytes): %s",
			AnnotationHistory, HistoryMaxRecords, HistoryMaxBytes, text.Truncate(string(raw), 512))
	}
	by := r.RequestedBy
	if r.RequestedVia != "" && r.RequestedVia != r.RequestedBy {
		by += " via " + r.RequestedVia
	}
	if r.RequestedAt != nil {
		by += " at " + r.RequestedAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("the record of config %q (%s, started %s, finished %s, requested by %s, configHash %s) left %s, which keeps the newest %d records within %d bytes; the whole record is in the agent's log",
		r.Config, r.Result, r.StartedAt.UTC().Format(time.RFC3339), r.FinishedAt.UTC().Format(time.RFC3339), by,
		r.ConfigHash, AnnotationHistory, HistoryMaxRecords, HistoryMaxBytes)
}
