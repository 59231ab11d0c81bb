package main

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// The assignment trail names the change behind a device from the whole
// records in <node>-mig-history, read again only when the Node's last
// change moved: polls between two changes read the cached Node alone.
func TestChangeRecordsReadOncePerChange(t *testing.T) {
	ctx := context.Background()
	hist := func(configs ...string) string {
		var recs []record.ChangeRecord
		for _, c := range configs {
			recs = append(recs, record.ChangeRecord{Config: c, Result: record.StateSuccess})
		}
		b, _ := json.Marshal(recs)
		return string(b)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.HistoryConfigMapName("n1"), Namespace: "ns"},
		Data: map[string]string{record.HistoryConfigMapKey: hist("a")}}
	c := fake.NewClientset(cm)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{record.AnnotationLastChange: `{"config":"a"}`}}}
	read := changeRecords(clientset.Wrap(c), "ns", "n1", func(context.Context) (*corev1.Node, error) { return node.DeepCopy(), nil })
	gets := func() int {
		n := 0
		for _, a := range c.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "configmaps" {
				n++
			}
		}
		return n
	}
	for range 3 {
		if recs := read(ctx); len(recs) != 1 || recs[0].Config != "a" {
			t.Fatalf("records %+v", recs)
		}
	}
	if g := gets(); g != 1 {
		t.Errorf("%d ConfigMap reads for one change, want 1", g)
	}
	cm.Data[record.HistoryConfigMapKey] = hist("b", "a")
	if _, err := c.CoreV1().ConfigMaps("ns").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Annotations[record.AnnotationLastChange] = `{"config":"b"}`
	if recs := read(ctx); len(recs) != 2 || recs[0].Config != "b" {
		t.Fatalf("after a new change: %+v", recs)
	}
	if g := gets(); g != 2 {
		t.Errorf("%d ConfigMap reads for two changes, want 2", g)
	}
}
