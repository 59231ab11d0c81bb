package assign

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/testkit/clientset"
)

// The ConfigMap store creates <node>-mig-assignments once, updates it
// after, and a second agent (a restart) reads what the first wrote; a
// ConfigMap that does not decode is an error, never overwritten.
func TestConfigMapStore(t *testing.T) {
	c := fake.NewClientset()
	ctx := context.Background()
	s := &ConfigMapStore{Client: clientset.Wrap(c), Namespace: "mig-agent", Node: "n1"}
	h, err := s.Load(ctx)
	if err != nil || len(h.Entries) != 0 || h.Node != "n1" {
		t.Fatalf("Load of nothing: %+v, %v", h, err)
	}
	h.Entries = append(h.Entries, Entry{Namespace: "ml", Pod: "p", Container: "c", Device: devA, Start: time.Unix(0, 0).UTC()})
	if err := s.Save(ctx, h); err != nil {
		t.Fatal(err)
	}
	end := time.Unix(60, 0).UTC()
	h.Entries[0].End = &end
	if err := s.Save(ctx, h); err != nil {
		t.Fatal(err)
	}
	cm, err := c.CoreV1().ConfigMaps("mig-agent").Get(ctx, "n1-mig-assignments", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels["migagent.io/node"] != "n1" || len(cm.OwnerReferences) != 0 || !strings.Contains(cm.Data[HistoryKey], `"end":"1970-01-01T00:01:00Z"`) {
		t.Errorf("ConfigMap %+v", cm)
	}
	again, err := (&ConfigMapStore{Client: clientset.Wrap(c), Namespace: "mig-agent", Node: "n1"}).Load(ctx)
	if err != nil || len(again.Entries) != 1 || again.Entries[0].End == nil {
		t.Errorf("a restarted agent reads %+v, %v", again, err)
	}
	read, err := ReadConfigMap(ctx, clientset.Wrap(c), "mig-agent", "n1")
	if err != nil || len(read.Entries) != 1 {
		t.Errorf("ReadConfigMap: %+v, %v", read, err)
	}
	if _, err := ReadConfigMap(ctx, clientset.Wrap(c), "mig-agent", "n2"); err == nil || !strings.Contains(err.Error(), ErrNoHistory.Error()) {
		t.Errorf("ReadConfigMap of a node without history: %v", err)
	}

	cm.Data[HistoryKey] = "{not json"
	if _, err := c.CoreV1().ConfigMaps("mig-agent").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := (&ConfigMapStore{Client: clientset.Wrap(c), Namespace: "mig-agent", Node: "n1"}).Load(ctx); err == nil {
		t.Error("a history that does not decode loaded")
	}
}

var devA = Device{UUID: "MIG-a", Profile: "1g.18gb", GPU: 0, GPUUUID: "GPU-0", Placement: "0+1"}
