package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/internal/text"
)

// Records always land: a reason is capped in the record (the log has it
// whole, the Event as much as the API server takes), a record the API
// server refuses is written again in its smallest form, and at least the
// state label is set, so the Node never keeps showing an old success; a
// history that cannot be parsed is kept aside, not dropped.

const (
	// AnnotationHistoryUnparsable keeps a migagent.io/history value that was
	// not a JSON array of records when the next record was written.
	AnnotationHistoryUnparsable = "migagent.io/history-unparsable"
	// MaxRecordReason bounds the reason of a record, in bytes.
	MaxRecordReason = 1024
	// ReasonRecordFailed is the Event reason of a record the API server refused.
	ReasonRecordFailed = "MigRecordFailed"
	// ReasonHistoryUnparsable is the Event reason of a history kept aside.
	ReasonHistoryUnparsable = "MigHistoryUnparsable"
)

// capReason shortens reason to MaxRecordReason bytes (at a rune boundary),
// saying how much was left out and where the whole text is.
func capReason(reason string) string {
	if len(reason) <= MaxRecordReason {
		return reason
	}
	suffix := fmt.Sprintf(" … (%d bytes in all; the whole reason is in the agent's log)", len(reason))
	cut := MaxRecordReason - len(suffix)
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut] + suffix
}

// historyParses says whether the Node's history annotation is absent or a
// JSON array (what Kube.Record can extend).
func historyParses(node *corev1.Node) bool {
	if node == nil {
		return true // standalone: no Node, no history
	}
	raw, ok := node.Annotations[AnnotationHistory]
	if !ok || raw == "" {
		return true
	}
	var hist []json.RawMessage
	return json.Unmarshal([]byte(raw), &hist) == nil
}

// writeRecord writes rec and state to the Node through API outages. When the
// API server refuses the record itself (too large, rejected by a policy),
// it writes the record again without the geometry, then the state label
// alone, so the state never stays behind the change; each refusal is
// logged and posted as a Warning Event.
func (d *Daemon) writeRecord(ctx context.Context, node *corev1.Node, rec ChangeRecord, state string) *corev1.Node {
	write := func(r ChangeRecord) error {
		return d.retryAPI(ctx, func() error {
			fresh, err := d.Cluster.GetNode(ctx)
			if err != nil {
				return err
			}
			node = fresh
			if !historyParses(fresh) {
				d.Log.Warn("the change history on the Node is not valid JSON; keeping it aside",
					"annotation", AnnotationHistory, "keptIn", AnnotationHistoryUnparsable, "value", text.Truncate(fresh.Annotations[AnnotationHistory], 512))
				d.event(ctx, fresh, corev1.EventTypeWarning, ReasonHistoryUnparsable,
					fmt.Sprintf("the %s annotation was not valid JSON; it is kept in %s and a new history starts", AnnotationHistory, AnnotationHistoryUnparsable))
			}
			return d.Cluster.Record(ctx, fresh, r, state)
		})
	}
	err := write(rec)
	if err == nil {
		return node
	}
	d.Log.Error("writing the change record failed", "config", rec.Config, "result", rec.Result, "err", err)
	if backoff.Permanent(err) {
		slim := rec
		slim.Geometry, slim.Reason = nil, text.Truncate(rec.Reason, 256)
		err2 := write(slim)
		if err2 == nil {
			d.event(ctx, node, corev1.EventTypeWarning, ReasonRecordFailed, "the full change record was refused ("+err.Error()+"); a shorter one was written")
			return node
		}
		d.Log.Error("writing the shortened change record failed", "err", err2)
	}
	// At least the state: a Node must not keep showing an old result.
	if err2 := d.retryAPI(ctx, func() error { return d.Cluster.SetState(ctx, state) }); err2 != nil {
		d.Log.Error("setting the state label failed", "state", state, "err", err2)
	}
	d.event(ctx, node, corev1.EventTypeWarning, ReasonRecordFailed, fmt.Sprintf("the %s record of config %q could not be written: %v", rec.Result, rec.Config, err))
	return node
}

// MaxDisrupted is the largest number of records whose disruption
// intervals, [disruptedAt, finishedAt], overlap at one instant: how many
// nodes were ever between taking a rollout slot and the end of their change
// at once (the --max-concurrent bound). Records without disruptedAt (no slot
// taken) do not count. An end and a start at the same instant do not
// overlap.
func MaxDisrupted(recs []ChangeRecord) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, r := range recs {
		if r.DisruptedAt != nil {
			edges = append(edges, edge{*r.DisruptedAt, +1}, edge{r.FinishedAt, -1})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // the end first
	})
	cur, most := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}
