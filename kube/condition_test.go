package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
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

// The state label and the condition land in one write, a patch of the
// Node's status (which takes labels too); where the status is refused the
// label still lands, without the condition.
func TestStateAndConditionOneWrite(t *testing.T) {
	ctx := context.Background()
	for _, refused := range []bool{false, true} {
		c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}})
		var patches []string
		c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sub := a.GetSubresource()
			patches = append(patches, "nodes/"+sub)
			if refused && sub == "status" {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes/status"}, "n1", nil)
			}
			return false, nil, nil
		})
		k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Namespace: "ns", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
		if err := k.SetState(ctx, record.StatePending); err != nil {
			t.Fatal(err)
		}
		n := mustNode(t, k)
		if n.Labels[record.LabelState] != record.StatePending {
			t.Errorf("refused=%v: state label %q", refused, n.Labels[record.LabelState])
		}
		cond := readyCondition(n)
		switch {
		case !refused && (len(patches) != 1 || patches[0] != "nodes/status"):
			t.Errorf("writes %v, want one patch of nodes/status", patches)
		case !refused && (cond == nil || cond.Reason != record.ConditionReasonPending):
			t.Errorf("condition %+v", cond)
		case refused && (len(patches) != 2 || patches[1] != "nodes/" || cond != nil):
			t.Errorf("status refused: writes %v, condition %+v; want the Node patched alone", patches, cond)
		}
	}
}
