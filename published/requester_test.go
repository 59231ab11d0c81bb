package published

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
)

func TestRequesterOf(t *testing.T) {
	mt := func(s int) *metav1.Time { x := metav1.NewTime(time.Unix(int64(s), 0)); return &x }
	labelBy := func(manager string, s int) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Time: mt(s),
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)}
	}
	stamp := `{"user":"system:serviceaccount:ops:alice","via":"kubectl-label","config":"all-balanced"}`
	for _, tc := range []struct {
		name       string
		stamp      string // "" = no annotation
		managed    []metav1.ManagedFieldsEntry
		config     string
		by, via    string
		at         int64 // 0 = none
		source     string
		ignoredWhy bool
	}{
		{name: "stamp", stamp: stamp, config: "all-balanced",
			by: "system:serviceaccount:ops:alice", via: "kubectl-label", source: RequesterFromAdmission},
		{name: "stamp and the same manager's managedFields give the time", stamp: stamp, config: "all-balanced",
			managed: []metav1.ManagedFieldsEntry{labelBy("kubectl-label", 200)},
			by:      "system:serviceaccount:ops:alice", via: "kubectl-label", at: 200, source: RequesterFromAdmission},
		{name: "another manager's managedFields entry is not this write's time", stamp: stamp, config: "all-balanced",
			managed: []metav1.ManagedFieldsEntry{labelBy("gitops", 200)},
			by:      "system:serviceaccount:ops:alice", via: "kubectl-label", source: RequesterFromAdmission},
		{name: "a claimed field manager does not replace the user",
			stamp:  `{"user":"bob","via":"system:serviceaccount:mig-agent:mig-agent","config":"all-balanced"}`,
			config: "all-balanced", by: "bob", via: "system:serviceaccount:mig-agent:mig-agent", source: RequesterFromAdmission},
		{name: "a stale stamp of an earlier value falls back to managedFields", stamp: stamp, config: "all-disabled",
			managed: []metav1.ManagedFieldsEntry{labelBy("gitops", 300)},
			by:      "gitops", via: "gitops", at: 300, source: RequesterFromManagedFields, ignoredWhy: true},
		{name: "a stale stamp and no managedFields is unknown", stamp: stamp, config: "all-disabled",
			by: record.RequesterUnknown, source: record.RequesterSourceUnknown, ignoredWhy: true},
		{name: "a stamp that does not parse", stamp: `{"user":`, config: "all-balanced",
			by: record.RequesterUnknown, source: record.RequesterSourceUnknown, ignoredWhy: true},
		// Finding 6: a stamp the policy could not encode (a control
		// character in the user name, before the policy escaped them) is
		// unknown, never the field manager the client chose.
		{name: "a stamp that does not parse is never replaced by managedFields", stamp: "{\"user\":\"mallory\x01\",\"via\":\"x\",\"config\":\"all-balanced\"}",
			config: "all-balanced", managed: []metav1.ManagedFieldsEntry{labelBy("alice@example.com", 300)},
			by: record.RequesterUnknown, source: record.RequesterSourceUnknown, ignoredWhy: true},
		{name: "a stamp without user", stamp: `{"config":"all-balanced"}`, config: "all-balanced",
			managed: []metav1.ManagedFieldsEntry{labelBy("alice@example.com", 300)},
			by:      record.RequesterUnknown, source: record.RequesterSourceUnknown, ignoredWhy: true},
		// An escaped control character (the policy's stamp) parses: the
		// name is the user's, as the API server authenticated it.
		{name: "an escaped control character", stamp: `{"user":"mallory\u0001","via":"x","config":"all-balanced"}`,
			config: "all-balanced", by: "mallory\x01", via: "x", source: RequesterFromAdmission},
		{name: "no stamp: managedFields", config: "all-balanced",
			managed: []metav1.ManagedFieldsEntry{labelBy("alice", 100), labelBy("bob", 200)},
			by:      "bob", via: "bob", at: 200, source: RequesterFromManagedFields},
		{name: "neither", config: "all-balanced", by: record.RequesterUnknown, source: record.RequesterSourceUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ManagedFields: tc.managed}}
			if tc.stamp != "" {
				node.Annotations = map[string]string{record.AnnotationRequestedBy: tc.stamp}
			}
			r := RequesterOf(node, tc.config)
			if r.By != tc.by || r.Via != tc.via || r.Source != tc.source || (r.Ignored != "") != tc.ignoredWhy {
				t.Errorf("RequesterOf = %+v, want by %q via %q source %q ignored %v", r, tc.by, tc.via, tc.source, tc.ignoredWhy)
			}
			switch {
			case tc.at == 0 && r.At != nil:
				t.Errorf("at %v, want none", r.At)
			case tc.at != 0 && (r.At == nil || r.At.Unix() != tc.at):
				t.Errorf("at %v, want %d", r.At, tc.at)
			}
		})
	}
}

func TestRequestedBy(t *testing.T) {
	at := func(s int) *metav1.Time { x := metav1.NewTime(time.Unix(int64(s), 0)); return &x }
	fields := metav1.NewFieldsV1
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Time: at(300), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:kubernetes.io/hostname":{}}}}`)},
		{Manager: "mig-agent", Time: at(400), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config.state":{}}}}`)},
		{Manager: "alice", Time: at(100), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)},
		{Manager: "bob", Time: at(200), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)},
	}}}
	by, when := requestedBy(node)
	if by != "bob" || when == nil || when.Unix() != 200 {
		t.Fatalf("requestedBy = %s %v, want bob at 200", by, when)
	}
	if by, _ := requestedBy(&corev1.Node{}); by != "unknown" {
		t.Fatalf("no managed fields: %s", by)
	}
}
