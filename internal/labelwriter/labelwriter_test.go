package labelwriter

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestOf(t *testing.T) {
	at := func(s int) *metav1.Time { x := metav1.NewTime(time.Unix(int64(s), 0)); return &x }
	fields := metav1.NewFieldsV1
	entries := []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Time: at(300), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:kubernetes.io/hostname":{}}}}`)},
		{Manager: "mig-agent", Time: at(400), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config.state":{}}}}`)},
		{Manager: "alice", Time: at(100), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)},
		{Manager: "bob", Time: at(200), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)},
		// An annotation of the same name is not the label.
		{Manager: "carol", Time: at(500), FieldsV1: fields(`{"f:metadata":{"f:annotations":{"f:nvidia.com/mig.config":{}}}}`)},
		{Manager: "broken", Time: at(600), FieldsV1: fields(`{"f:metadata":`)},
		{Manager: "none", Time: at(700)},
	}
	m, when, ok := Of(entries, "nvidia.com/mig.config")
	if !ok || m != "bob" || when == nil || when.Unix() != 200 {
		t.Fatalf("Of = %s %v %v, want bob at 200", m, when, ok)
	}
	if m, _, ok := Of(entries, "nvidia.com/mig.config.state"); !ok || m != "mig-agent" {
		t.Fatalf("state label: %s %v", m, ok)
	}
	if m, _, ok := Of(nil, "nvidia.com/mig.config"); ok || m != "" {
		t.Fatalf("no entries: %q %v", m, ok)
	}
	// An entry without a time loses to one with a time.
	m, _, _ = Of([]metav1.ManagedFieldsEntry{
		{Manager: "untimed", FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:x":{}}}}`)},
		{Manager: "timed", Time: at(1), FieldsV1: fields(`{"f:metadata":{"f:labels":{"f:x":{}}}}`)},
	}, "x")
	if m != "timed" {
		t.Fatalf("untimed entry won: %s", m)
	}
}
