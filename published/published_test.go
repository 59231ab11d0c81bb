package published

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// NodeOf reads the labels and the records: the applied config is the
// newest success, the geometry the newest record that has one, whichever
// annotation holds it.
func TestNodeOf(t *testing.T) {
	at := time.Unix(1000, 0).UTC()
	last := record.ChangeRecord{Config: "b", Result: record.StateFailed, StartedAt: at, FinishedAt: at.Add(2 * time.Second)}
	ok := record.ChangeRecord{Config: "a", Result: record.StateSuccess, StartedAt: at.Add(-time.Minute), FinishedAt: at.Add(-50 * time.Second),
		Geometry: map[string][]string{"1": {"3g.71gb@4", "3g.71gb@0"}, "0": {}}}
	lastJSON, _ := json.Marshal(last)
	histJSON, _ := json.Marshal([]record.ChangeRecord{last, ok})
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Labels:      map[string]string{record.LabelConfig: "b", record.LabelState: record.StateFailed},
		Annotations: map[string]string{record.AnnotationLastChange: string(lastJSON), record.AnnotationHistory: string(histJSON)}}}
	got := NodeOf(n)
	if got.Desired != "b" || got.State != record.StateFailed || got.Applied != "a" {
		t.Errorf("NodeOf = %+v", got)
	}
	if got.GeometryAt == nil || !got.GeometryAt.Equal(ok.FinishedAt) || len(got.Geometry) != 2 ||
		got.Geometry[1].Index != 1 || got.Geometry[1].Instances[0] != "3g.71gb@0" || got.Geometry[1].Profiles["3g.71gb"] != 2 {
		t.Errorf("geometry %+v at %v", got.Geometry, got.GeometryAt)
	}
	if empty := NodeOf(&corev1.Node{}); empty.Applied != "" || empty.GeometryAt != nil {
		t.Errorf("a bare Node: %+v", empty)
	}
}

// GPUs reads what the agent published; a node whose agent published
// nothing is ErrNotPublished, as is a ConfigMap without the annotation;
// a node without a trail has none, and no error.
func TestGPUsAndTrail(t *testing.T) {
	h200, found := profiles.ModelByKey("h200")
	if !found {
		t.Fatal("no h200")
	}
	gpu := geometry.GPU{Index: 0, UUID: "GPU-0", Name: h200.Name, PCIDeviceID: h200.PCIDeviceID, MigCapable: true, Catalogue: h200.Catalogue}
	doc, _ := json.Marshal(geometry.Publish([]geometry.GPU{gpu}, nil, time.Unix(4000, 0)))
	c := clientset.Wrap(fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: record.ConfigsConfigMapName("n1"),
			Annotations: map[string]string{record.AnnotationGPUs: string(doc)}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: record.ConfigsConfigMapName("n2")}}))
	ctx := context.Background()
	if _, gpus, err := GPUs(ctx, c, "ns", "n1"); err != nil || len(gpus) != 1 || gpus[0].Name != h200.Name {
		t.Errorf("n1: %+v, %v", gpus, err)
	}
	for _, node := range []string{"n2", "n3"} {
		if _, _, err := GPUs(ctx, c, "ns", node); !errors.Is(err, ErrNotPublished) {
			t.Errorf("%s: %v, want ErrNotPublished", node, err)
		}
	}
	if h, err := Trail(ctx, c, "ns", "n1"); h != nil || err != nil {
		t.Errorf("no trail: %+v, %v", h, err)
	}
}
