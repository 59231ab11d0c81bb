package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// Records that always land: a user who may patch Nodes fills the Node's
// annotations with one of their own, close to Kubernetes' 256 KiB limit on
// them all. The next label change is refused before anything is touched:
// state failed, a record and a Warning Event that name the room missing and
// the annotation that takes it, no pod evicted, no taint, the GPU as it
// was. Once the user's annotation is gone, the retry applies the change.
func TestBudgetRecordMustFit(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node, kl, ns := kubeletNode(t)
	o := (&Opts{Node: node, Sim: "h200x1", Extra: []string{"--retry-backoff-max", "5s"}}).Fill(t)
	gpu := disProfiles(t, o.Sim, o.SimState)[0]
	kl.RunPod(t, ns, "train", map[string]string{"nvidia.com/gpu": "1"},
		map[string][]string{"nvidia.com/gpu": {gpu.UUID}}, disOwner("train"))
	o.Extra = append(o.Extra, "--pod-resources-socket", kl.Socket())

	// 20 KiB left: room for the records of this change, none for a
	// record and a history at their bounds (46 KiB).
	const key = "example.com/inventory"
	fill := strings.Repeat("x", record.AnnotationBudget-20<<10)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: fill}}})
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", 30*time.Second)
	if !strings.Contains(rec.Reason, "no room for the change record") || !strings.Contains(rec.Reason, key) {
		t.Errorf("failed record's reason: %q", rec.Reason)
	}
	if len(rec.EvictedPods) != 0 || rec.DisruptedAt != nil || strings.Join(rec.Geometry["0"], ",") != "mig-disabled" {
		t.Errorf("refused change: evicted %v, disrupted at %v, geometry %v", rec.EvictedPods, rec.DisruptedAt, rec.Geometry)
	}
	// The Event follows the record (posted after it), as the other tests
	// wait for theirs.
	var evs []corev1.Event
	WaitFor(t, 10*time.Second, "the "+record.ReasonPreflight+" Event", func() bool {
		evs = nodeEvents(t, c, node, record.ReasonPreflight)
		return len(evs) > 0
	})
	if len(evs) == 0 || evs[0].Type != corev1.EventTypeWarning || !strings.Contains(evs[0].Message, "262144 bytes") {
		t.Errorf("no Warning %s naming the limit: %v", record.ReasonPreflight, evs)
	}
	if live := disLivePods(t, c, ns); len(live) != 1 || len(kl.Finished()) != 0 {
		t.Errorf("pods: %v live, %v finished; want train, untouched", live, kl.Finished())
	}
	if g := disProfiles(t, o.Sim, o.SimState)[0]; g.MigMode.Current || len(g.Instances) != 0 {
		t.Errorf("the GPU was changed: MIG %v, %d instances", g.MigMode.Current, len(g.Instances))
	}
	if disTainted(GetNode(t, c, node)) {
		t.Error("the node was tainted")
	}
	if n := len(nodeEvents(t, c, node, record.ReasonStarted)); n != 0 {
		t.Errorf("%d %s Events", n, record.ReasonStarted)
	}

	// The room made: the retry applies the change, and its record lands.
	patch, _ = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: nil}}})
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rec = WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 60*time.Second)
	if len(rec.EvictedPods) != 1 {
		t.Errorf("evicted %v, want the one pod", rec.EvictedPods)
	}
}
