package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/internal/apierr"
	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// The writing of a change record on the Node, whole: the record bounded
// (once, here), put at the head of the history with the history's bound,
// patched with the state label, retried through an API server outage, a
// shorter record or the state label alone when the whole one is refused,
// and each record the history's bound drops logged and named in an Event.
// The core decides when a change ends and hands its record to Record.

// recordRetry bounds how long a record write rides out an API server
// outage.
const recordRetry = 2 * time.Minute

// Record implements reconcile.Cluster: the record, the state label and
// the condition MIGConfigReady in one patch (patchState), on the Node as
// read just before (its history is kept). A
// history that is not valid JSON is set aside (Warning Event). When the
// whole record is refused, a shorter one (no geometry, a short reason) is
// written, with a Warning Event; when none can be, the state label alone,
// with a Warning Event that names the record; the error is returned then.
// state "" keeps the Node's state label (pending when it has none).
func (k *Cluster) Record(ctx context.Context, rec record.ChangeRecord, state string) error {
	// Whatever a name, a pod list or an error says, a bounded record lands
	// and never pushes more than its share out of the history.
	rec = rec.Bounded()
	// The whole record first, off the Node; the Node gets its light form
	// when that landed, else the record whole.
	whole := k.keepWhole(ctx, rec)
	var node *corev1.Node
	write := func(r record.ChangeRecord) error {
		return k.retry(ctx, func() error {
			fresh, err := k.getNode(ctx)
			if err != nil {
				return err
			}
			node = fresh
			if !historyParses(fresh) {
				k.log().Warn("the change history on the Node is not valid JSON; keeping it aside",
					"annotation", record.AnnotationHistory, "keptIn", record.AnnotationHistoryUnparsable, "value", record.Truncate(fresh.Annotations[record.AnnotationHistory], 512))
				k.warn(ctx, fresh, record.ReasonHistoryUnparsable,
					fmt.Sprintf("the %s annotation was not valid JSON; it is kept in %s and a new history starts", record.AnnotationHistory, record.AnnotationHistoryUnparsable))
			}
			st := state
			if st == "" {
				if st = fresh.Labels[record.LabelState]; st == "" {
					st = record.StatePending
				}
			}
			return k.recordOn(ctx, fresh, r, st, whole)
		})
	}
	err := write(rec)
	if err == nil {
		return nil
	}
	k.log().Error("writing the change record failed", "config", rec.Config, "result", rec.Result, "err", err)
	if apierr.Permanent(err) {
		slim := rec
		slim.Geometry, slim.Reason = nil, record.Truncate(rec.Reason, 256)
		err2 := write(slim)
		if err2 == nil {
			k.warn(ctx, node, record.ReasonRecordFailed, "the full change record was refused ("+err.Error()+"); a shorter one was written")
			return nil
		}
		k.log().Error("writing the shortened change record failed", "err", err2)
	}
	// The state label alone, except success: a change whose record did
	// not land is not reported a success (the core records its failure).
	if state != "" && state != record.StateSuccess {
		if err2 := k.retry(ctx, func() error { return k.SetState(ctx, state) }); err2 != nil {
			k.log().Error("setting the state label failed", "state", state, "err", err2)
		}
	}
	k.warn(ctx, node, record.ReasonRecordFailed, fmt.Sprintf("the %s record of config %q (%s) could not be written: %v",
		rec.Result, rec.Config, requestedBy(rec), err))
	return fmt.Errorf("the change record did not land: %w", err)
}

// recordOn writes a change record as the last change and at the head of
// the history (within nodeHistoryBound), together with the state label
// and the condition, in one patch on node as read just before, in its light form where the history ConfigMap
// holds it whole (whole.ref). Once written, the record is logged whole (the
// agent's own trail of every record), and each record that the history
// bound dropped (the ConfigMap's, whole.dropped, where it holds the
// history; the Node's for an entry only the Node held) leaves a log line
// and an Event (retire): a record leaves the history, never the trail.
func (k *Cluster) recordOn(ctx context.Context, node *corev1.Node, rec record.ChangeRecord, state string, whole wholeKept) error {
	dropped, err := k.recordNode(ctx, node, rec, state, whole)
	if err != nil {
		return err
	}
	onNode := nodeHistoryBound
	raw, _ := json.Marshal(rec)
	k.log().Info("change record", "config", rec.Config, "result", rec.Result, "requestedBy", rec.RequestedBy,
		"requestedVia", rec.RequestedVia, "record", string(raw))
	if whole.ref == "" {
		for _, old := range dropped {
			k.retire(ctx, node, old, onNode)
		}
		return nil
	}
	// The ConfigMap holds the history: a record leaves it by the
	// ConfigMap's bound; one that leaves the Node is still there, except
	// an entry the Node alone held whole (written while the ConfigMap
	// refused it).
	for _, old := range whole.dropped {
		k.retire(ctx, node, old, configMapHistory(whole.ref))
	}
	for _, old := range dropped {
		if r, err := record.Decode(old); err != nil || (r.FullRecord == "" && !whole.held[published.RecordKey(r)]) {
			k.retire(ctx, node, old, onNode)
		}
	}
	return nil
}

// RecordRetiring patches rec as the last change and at the head of node's
// history, with the state label, and returns the records that the history
// bound dropped from the history (oldest last) when the write succeeded.
// A history that is not a JSON array is kept aside, not dropped.
func (k *Cluster) RecordRetiring(ctx context.Context, node *corev1.Node, rec record.ChangeRecord, state string) ([]json.RawMessage, error) {
	return k.recordNode(ctx, node, rec, state, wholeKept{})
}

// recordNode is RecordRetiring with the record in its light form on the
// Node (record.OnNode as the last change, record.InNodeHistory in the
// history) where whole.ref holds it whole; "" writes it whole. The entries
// the Node keeps whole (an older agent's, or this one's while the
// ConfigMap could not be written) turn light too once the ConfigMap holds
// them (whole.held): an upgraded Node is light from its first change.
func (k *Cluster) recordNode(ctx context.Context, node *corev1.Node, rec record.ChangeRecord, state string, whole wholeKept) ([]json.RawMessage, error) {
	ref := whole.ref
	last, err := json.Marshal(rec.OnNode(ref))
	if err != nil {
		return nil, err
	}
	entry := last
	if ref != "" {
		if entry, err = rec.InNodeHistory(ref).NodeEntryJSON(); err != nil {
			return nil, err
		}
	}
	var hist []json.RawMessage
	aside := ""
	if node != nil {
		if raw := node.Annotations[record.AnnotationHistory]; raw != "" {
			if err := json.Unmarshal([]byte(raw), &hist); err != nil {
				// Not ours to drop: kept aside, and a new history starts.
				hist, aside = nil, record.Truncate(raw, record.HistoryMaxBytes)
			}
		}
	}
	for i, e := range hist {
		if r, err := record.Decode(e); err == nil && r.FullRecord == "" && whole.held[published.RecordKey(r)] {
			if light, err := r.InNodeHistory(ref).NodeEntryJSON(); err == nil {
				hist[i] = light
			}
		}
	}
	hist, dropped := nodeHistoryBound.keep(append([]json.RawMessage{entry}, hist...))
	histJSON, _ := json.Marshal(hist)
	annotations := map[string]any{record.AnnotationLastChange: string(last), record.AnnotationHistory: string(histJSON)}
	if aside != "" {
		annotations[record.AnnotationHistoryUnparsable] = aside
	}
	meta := map[string]any{"annotations": annotations, "labels": map[string]any{record.LabelState: state}}
	if err := k.patchState(ctx, node, meta, state, &rec); err != nil {
		return nil, err
	}
	return dropped, nil
}

// historyParses reports whether the Node's history annotation is valid
// JSON (missing counts as valid): one that is not is set aside.
func historyParses(node *corev1.Node) bool {
	_, err := record.SplitHistory(node.Annotations[record.AnnotationHistory])
	return err == nil
}

// historyBound is a history and its bounds: the history ConfigMap (where
// it holds the records whole) or, where it could not be written, the
// Node's annotation (bytes 0: no byte bound).
type historyBound struct {
	where          string
	records, bytes int
}

// The two histories' caps, in this one place: the Node's
// (record.NodeHistoryMaxRecords, light) and the ConfigMap's
// (record.HistoryMaxRecords, whole).
var nodeHistoryBound = historyBound{where: record.AnnotationHistory, records: record.NodeHistoryMaxRecords, bytes: record.HistoryMaxBytes}

// configMapHistory is the bound of the history ConfigMap ref
// (record.FullRecordRef).
func configMapHistory(ref string) historyBound {
	return historyBound{where: ref, records: record.HistoryMaxRecords}
}

// keep cuts hist (newest first) to b's bounds: the newest b.records, then,
// under a byte bound, the oldest until its JSON fits (the newest always
// stays). It returns those kept and those dropped (oldest last).
func (b historyBound) keep(hist []json.RawMessage) (kept, dropped []json.RawMessage) {
	if len(hist) > b.records {
		hist, dropped = hist[:b.records], hist[b.records:]
	}
	for b.bytes > 0 && len(hist) > 1 {
		if j, _ := json.Marshal(hist); len(j) <= b.bytes {
			break
		}
		dropped = append([]json.RawMessage{hist[len(hist)-1]}, dropped...)
		hist = hist[:len(hist)-1]
	}
	return hist, dropped
}

// String says it in an Event: "ConfigMap ns/n-mig-history, which keeps the
// newest 16 records".
func (b historyBound) String() string {
	s := fmt.Sprintf("%s, which keeps the newest %d records", b.where, b.records)
	if b.bytes > 0 {
		s += fmt.Sprintf(" within %d bytes", b.bytes)
	}
	return s
}

// retire logs a record dropped from the history, whole, and posts a Normal
// Event that names it.
func (k *Cluster) retire(ctx context.Context, node *corev1.Node, raw json.RawMessage, from historyBound) {
	uid := string(node.UID)
	k.log().Info("change record dropped from the history by its bound; kept in this log",
		"history", from.where, "maxRecords", from.records, "maxBytes", from.bytes, "record", string(raw))
	if err := k.event(context.WithoutCancel(ctx), uid, corev1.EventTypeNormal, record.ReasonRecordRetired, retiredMessage(raw, from)); err != nil {
		k.log().Warn("posting an event failed", "reason", record.ReasonRecordRetired, "err", err)
	}
}

// retiredMessage names a dropped record in an Event: its config, result,
// times and requester (the whole record is in the agent's log).
func retiredMessage(raw json.RawMessage, from historyBound) string {
	var r record.ChangeRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Sprintf("a record that was not valid JSON left %s: %s", from, record.Truncate(string(raw), 512))
	}
	by := requestedBy(r)
	if r.RequestedAt != nil {
		by += " at " + r.RequestedAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("the record of config %q (%s, started %s, finished %s, %s, configHash %s) left %s; the whole record is in the agent's log",
		r.Config, r.Result, r.StartedAt.UTC().Format(time.RFC3339), r.FinishedAt.UTC().Format(time.RFC3339), by,
		r.ConfigHash, from)
}

// requestedBy names who asked for a record's change, as every Event that
// names a requester does (record.RequestedByText).
func requestedBy(r record.ChangeRecord) string {
	return record.RequestedByText(r.RequestedBy, r.RequestedVia, r.RequestedBySource)
}

// warn posts a Warning Event on node (nil: by name only); a failure is
// logged.
func (k *Cluster) warn(ctx context.Context, node *corev1.Node, reason, msg string) {
	uid := ""
	if node != nil {
		uid = string(node.UID)
	}
	if err := k.event(context.WithoutCancel(ctx), uid, corev1.EventTypeWarning, reason, msg); err != nil {
		k.log().Warn("posting an event failed", "reason", reason, "err", err)
	}
}

// retry retries an API call through an API server outage (apierr.Transient
// errors, backoff.API waits) for up to recordRetry.
func (k *Cluster) retry(ctx context.Context, fn func() error) error {
	return backoff.Retry(ctx, k.Clock, recordRetry, apierr.Transient, func(err error) {
		k.log().Debug("API call failed; retrying", "err", err)
	}, fn)
}
