package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/internal/apierr"
	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/internal/text"
	"github.com/migagent/mig-agent/record"
)

// recordRetry bounds how long a record write rides out an API server
// outage.
const recordRetry = 2 * time.Minute

// Record implements reconcile.Cluster: the record and the state label in
// one patch, on the Node as read just before (its history is kept). A
// history that is not valid JSON is set aside (Warning Event). When the
// whole record is refused, a shorter one (no geometry, a short reason) is
// written, with a Warning Event; when none can be, the state label alone,
// with a Warning Event that names the record; the error is returned then.
// state "" keeps the Node's state label (pending when it has none).
func (k *Cluster) Record(ctx context.Context, rec record.ChangeRecord, state string) error {
	rec = rec.Bounded() // whatever the caller built: a bounded record lands
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
					"annotation", record.AnnotationHistory, "keptIn", record.AnnotationHistoryUnparsable, "value", text.Truncate(fresh.Annotations[record.AnnotationHistory], 512))
				k.warn(ctx, fresh, record.ReasonHistoryUnparsable,
					fmt.Sprintf("the %s annotation was not valid JSON; it is kept in %s and a new history starts", record.AnnotationHistory, record.AnnotationHistoryUnparsable))
			}
			st := state
			if st == "" {
				if st = fresh.Labels[record.LabelState]; st == "" {
					st = record.StatePending
				}
			}
			return k.recordOn(ctx, fresh, r, st)
		})
	}
	err := write(rec)
	if err == nil {
		return nil
	}
	k.log().Error("writing the change record failed", "config", rec.Config, "result", rec.Result, "err", err)
	if apierr.Permanent(err) {
		slim := rec
		slim.Geometry, slim.Reason = nil, text.Truncate(rec.Reason, 256)
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
		rec.Result, rec.Config, requestedByText(rec), err))
	return fmt.Errorf("the change record did not land: %w", err)
}

// historyParses reports whether the Node's history annotation is valid
// JSON (missing counts as valid): one that is not is set aside.
func historyParses(node *corev1.Node) bool {
	_, err := record.SplitHistory(node.Annotations[record.AnnotationHistory])
	return err == nil
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
