package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/record"
)

// The condition follows each state, and says Unknown once nothing is asked
// (the desired label removed, the state label with it).
func TestConditionPerState(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	failed := &record.ChangeRecord{Config: "a", Result: record.StateFailed, Reason: "boom"}
	for _, tc := range []struct {
		state  string
		rec    *record.ChangeRecord
		status corev1.ConditionStatus
		reason string
	}{
		{record.StateSuccess, nil, corev1.ConditionTrue, record.ConditionReasonSuccess},
		{record.StatePending, nil, corev1.ConditionFalse, record.ConditionReasonPending},
		{record.StateRebooting, nil, corev1.ConditionFalse, record.ConditionReasonRebooting},
		{record.StateFailed, failed, corev1.ConditionFalse, record.ConditionReasonFailed},
		{"", nil, corev1.ConditionUnknown, record.ConditionReasonNotRequested},
	} {
		c := Condition(tc.state, "a", tc.rec, nil, now)
		if c.Type != record.ConditionConfigReady || c.Status != tc.status || c.Reason != tc.reason || c.Message == "" {
			t.Errorf("state %q: %+v", tc.state, c)
		}
	}
	prev := Condition(record.StatePending, "a", nil, nil, now)
	if c := Condition(record.StateFailed, "a", failed, &prev, now.Add(time.Minute)); !c.LastTransitionTime.Equal(&prev.LastTransitionTime) {
		t.Errorf("False → False moved lastTransitionTime: %v", c.LastTransitionTime)
	}
}
