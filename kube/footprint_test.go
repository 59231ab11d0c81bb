package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// typicalRecord is the record of a change on a node of 8 H200s: 2 GPUs
// changed to all-balanced's split, the others kept, pods of a usual name
// length evicted from the changed GPUs, a user stamped by the policy.
func typicalRecord(i int, pods int) record.ChangeRecord {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Hour)
	fin := at.Add(40 * time.Second)
	geo := map[string][]string{}
	for g := range 8 {
		geo[fmt.Sprint(g)] = []string{"1g.18gb@0", "1g.18gb@1", "2g.35gb@2", "3g.71gb@4"}
	}
	var evicted []string
	for p := range pods {
		evicted = append(evicted, fmt.Sprintf("ml-training/llama-finetune-worker-7d9f8b6c5-%05d", i*100+p))
	}
	converged := true
	return record.ChangeRecord{Config: "all-balanced", PreviousConfig: "all-1g.18gb", Result: record.StateSuccess,
		StartedAt: at, FinishedAt: fin, DisruptedAt: &at, GPUsChanged: []int{0, 1}, GPUsUntouched: []int{2, 3, 4, 5, 6, 7},
		EvictedPods: evicted, AgentVersion: "1.4.0", DriverVersion: "580.159.04",
		ConfigHash:         "sha256:5d41402abc4b2a76b9719d911017c592ae2b7c1b5f0e3d0c9a8f7e6d5c4b3a29",
		PreviousConfigHash: "sha256:7f83b1657ff1fc53b92dc18148a1d65dfc2d4b1fa3d677284addd200126d9069",
		ConfigSource:       "/etc/mig-agent/config.yaml@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
		RequestedBy:        "alice@example.com", RequestedVia: "kubectl-label", RequestedBySource: record.RequesterSourceStamp,
		RequestedAt: &at, ResourcesConverged: &converged, AffectedBy: record.AffectedByPodResources,
		ServedBy: record.ServedByDevicePlugin, Geometry: geo}
}

// FootprintBefore is what the records added to a Node after the 20
// changes of TestNodeFootprintAfterTwentyChanges when the Node held them
// whole (every pod named, the geometry in each history entry, no
// ConfigMap): 28,738 bytes.
const footprintBefore = 28738

// The agent's annotations on a Node after 20 changes, each evicting 8
// pods of a usual name length: within AnnotationBudget (4 KiB; about a
// seventh of footprintBefore): the last change within 2 KiB, the newest
// record.NodeHistoryMaxRecords history entries light (no pod named, the
// whole record in the ConfigMap); the ConfigMap holds the newest
// record.HistoryMaxRecords records whole, every pod named.
func TestNodeFootprintAfterTwentyChanges(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Namespace: "mig-agent", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	for i := range 20 {
		if err := k.Record(ctx, typicalRecord(i, 8), record.StateSuccess); err != nil {
			t.Fatal(err)
		}
	}
	n, _ := k.getNode(ctx)
	got := AnnotationBytes(n)
	t.Logf("the agent's annotations on the Node after 20 changes: %d bytes (last-change %d, history %d); with the condition %d; before the light form: %d",
		got, len(n.Annotations[record.AnnotationLastChange]), len(n.Annotations[record.AnnotationHistory]), Footprint(n), footprintBefore)
	if got > AnnotationBudget {
		t.Errorf("the agent's annotations weigh %d bytes on the Node, bound %d", got, AnnotationBudget)
	}
	if l := len(n.Annotations[record.AnnotationLastChange]); l > 2<<10 {
		t.Errorf("the last change takes %d bytes on the Node, want at most 2 KiB", l)
	}
	whole, _, found, err := published.ReadHistory(ctx, k.Client, "mig-agent", "n1")
	if err != nil || !found || len(whole) != record.HistoryMaxRecords {
		t.Fatalf("the history ConfigMap: %d records, found %v, %v", len(whole), found, err)
	}
	if len(whole[0].EvictedPods) != 8 || whole[0].Geometry == nil || whole[0].FullRecord != "" {
		t.Errorf("the ConfigMap's newest record is not whole: %+v", whole[0])
	}
	hist := record.Trail(n.Annotations)
	if len(hist) != record.NodeHistoryMaxRecords || hist[0].EvictedPodCount != 8 || hist[0].EvictedPodsOmitted != 8 ||
		hist[0].FullRecord != "ConfigMap mig-agent/n1-mig-history" || hist[0].Geometry != nil || hist[0].ConfigHash == "" ||
		hist[0].RequestedBy != "alice@example.com" {
		t.Errorf("the Node's newest history entry: %+v", hist[0])
	}
	for i, r := range hist {
		if !r.StartedAt.Equal(whole[i].StartedAt) || r.Config != whole[i].Config {
			t.Errorf("the Node's history entry %d is not the ConfigMap's: %+v", i, r)
		}
	}
}
