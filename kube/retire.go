package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/internal/text"
	"github.com/migagent/mig-agent/record"
)

// retire logs a record dropped from the history, whole, and posts a Normal
// Event that names it.
func (k *Cluster) retire(ctx context.Context, node *corev1.Node, raw json.RawMessage) {
	uid := string(node.UID)
	k.log().Info("change record dropped from the history by its bound; kept in this log",
		"annotation", record.AnnotationHistory, "maxRecords", record.HistoryMaxRecords, "maxBytes", record.HistoryMaxBytes, "record", string(raw))
	if err := k.event(context.WithoutCancel(ctx), uid, corev1.EventTypeNormal, record.ReasonRecordRetired, retiredMessage(raw)); err != nil {
		k.log().Warn("posting an event failed", "reason", record.ReasonRecordRetired, "err", err)
	}
}

// retiredMessage names a dropped record in an Event: its config, result,
// times and requester (the whole record is in the agent's log).
func retiredMessage(raw json.RawMessage) string {
	var r record.ChangeRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Sprintf("a record that was not valid JSON left %s (the history keeps %d records, %d bytes): %s",
			record.AnnotationHistory, record.HistoryMaxRecords, record.HistoryMaxBytes, text.Truncate(string(raw), 512))
	}
	by := requestedByText(r)
	if r.RequestedAt != nil {
		by += " at " + r.RequestedAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("the record of config %q (%s, started %s, finished %s, requested by %s, configHash %s) left %s, which keeps the newest %d records within %d bytes; the whole record is in the agent's log",
		r.Config, r.Result, r.StartedAt.UTC().Format(time.RFC3339), r.FinishedAt.UTC().Format(time.RFC3339), by,
		r.ConfigHash, record.AnnotationHistory, record.HistoryMaxRecords, record.HistoryMaxBytes)
}

// requestedByText names who asked for a record's change and how the agent
// knows, for Events and logs: "requested by alice via kubectl-label
// (stamp)"; control characters are escaped, the name bounded.
func requestedByText(r record.ChangeRecord) string {
	by := "requested by " + escapeControl(record.BoundText(r.RequestedBy, record.MaxRequester))
	if r.RequestedVia != "" && r.RequestedVia != r.RequestedBy {
		by += " via " + escapeControl(record.BoundText(r.RequestedVia, record.MaxRequester))
	}
	src := r.RequestedBySource
	if src == "" {
		src = record.RequesterSourceUnknown
	}
	return by + " (" + src + ")"
}

// escapeControl writes the control characters of s as Go escapes (\n,
// \x01): an Event or a terminal shows them, never acts on them.
func escapeControl(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
