package kube

import (
	"context"
	"encoding/json"
	"strings"
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

	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/published/status"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
)

// The history ConfigMap: created owned by the Node, labelled, started with
// the records an earlier agent kept on the Node; the condition follows each
// record (True on success, False with the reason and config on failure,
// its transition time kept while the status stays).
func TestHistoryConfigMapAndCondition(t *testing.T) {
	ctx := context.Background()
	old, _ := json.Marshal([]record.ChangeRecord{typicalRecord(0, 3)})
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1",
		Annotations: map[string]string{record.AnnotationHistory: string(old)}}})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Namespace: "ns", Clock: clk}
	if err := k.Record(ctx, typicalRecord(1, 40), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	cm, err := c.CoreV1().ConfigMaps("ns").Get(ctx, "n1-mig-history", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels[record.LabelManagedBy] != "mig-agent" || cm.Labels[record.LabelNode] != "n1" ||
		len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Kind != "Node" || cm.OwnerReferences[0].UID != "u1" {
		t.Errorf("ConfigMap metadata: %+v", cm.ObjectMeta)
	}
	whole, _, _, err := published.ReadHistory(ctx, k.Client, "ns", "n1")
	if err != nil || len(whole) != 2 || len(whole[0].EvictedPods) != 40 || len(whole[1].EvictedPods) != 3 {
		t.Fatalf("the whole history: %d records (%v)", len(whole), err)
	}
	n, _ := k.getNode(ctx)
	last := LastChangeOf(t, n)
	if last.EvictedPodCount != 40 || len(last.EvictedPods)+last.EvictedPodsOmitted != 40 || len(last.EvictedPods) == 40 ||
		last.FullRecord != "ConfigMap ns/n1-mig-history" {
		t.Errorf("last change on the Node: %d named, %d omitted, count %d, fullRecord %q",
			len(last.EvictedPods), last.EvictedPodsOmitted, last.EvictedPodCount, last.FullRecord)
	}
	cond := readyCondition(n)
	if cond == nil || cond.Status != corev1.ConditionTrue || cond.Reason != record.ConditionReasonSuccess ||
		!strings.Contains(cond.Message, `"all-balanced"`) {
		t.Fatalf("condition after success: %+v", cond)
	}
	since := cond.LastTransitionTime
	clk.Step(time.Minute)
	if err := k.Record(ctx, typicalRecord(2, 0), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	if got := readyCondition(mustNode(t, k)); !got.LastTransitionTime.Equal(&since) || got.LastHeartbeatTime.Equal(&since) {
		t.Errorf("a second success moved the transition time or kept the heartbeat: %+v", got)
	}
	failed := typicalRecord(3, 0)
	failed.Config, failed.Result, failed.Reason = "all-7g.141gb", record.StateFailed, "eviction blocked by a PodDisruptionBudget"
	if err := k.Record(ctx, failed, record.StateFailed); err != nil {
		t.Fatal(err)
	}
	got := readyCondition(mustNode(t, k))
	if got.Status != corev1.ConditionFalse || got.Reason != record.ConditionReasonFailed ||
		!strings.Contains(got.Message, `"all-7g.141gb"`) || !strings.Contains(got.Message, "PodDisruptionBudget") || got.LastTransitionTime.Equal(&since) {
		t.Errorf("condition after a failure: %+v", got)
	}
	// The state label alone (a change under way): False, Pending.
	if err := k.SetState(ctx, record.StatePending); err != nil {
		t.Fatal(err)
	}
	if got := readyCondition(mustNode(t, k)); got.Status != corev1.ConditionFalse || got.Reason != record.ConditionReasonPending {
		t.Errorf("condition while pending: %+v", got)
	}
}

// A ConfigMap the API server refuses (no policy lets the agent write it,
// no RBAC): the Node keeps the record whole, as before the ConfigMap, and a
// Warning Event says so.
func TestHistoryConfigMapRefused(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}})
	c.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "n1-mig-history", nil)
	})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Namespace: "ns", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	if err := k.Record(ctx, typicalRecord(1, 40), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	n := mustNode(t, k)
	hist := record.Trail(n.Annotations)
	if len(hist) != 1 || len(hist[0].EvictedPods) != 40 || hist[0].FullRecord != "" || hist[0].Geometry == nil {
		t.Errorf("the Node's history entry is not whole: %+v", hist)
	}
	evs, _ := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	found := false
	for _, e := range evs.Items {
		found = found || e.Reason == record.ReasonHistoryUnwritable
	}
	if !found {
		t.Errorf("no %s Event", record.ReasonHistoryUnwritable)
	}
}

func mustNode(t *testing.T, k *Cluster) *corev1.Node {
	t.Helper()
	n, err := k.getNode(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i, c := range n.Status.Conditions {
		if c.Type == record.ConditionConfigReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// LastChangeOf decodes the Node's last change.
func LastChangeOf(t *testing.T, n *corev1.Node) record.ChangeRecord {
	t.Helper()
	r, err := record.Decode([]byte(n.Annotations[record.AnnotationLastChange]))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// `mig-agent status` with the history ConfigMap: the Node's light records
// are replaced by their whole form, the last change too.
func TestStatusWithHistory(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Namespace: "ns", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	for i := range 3 {
		if err := k.Record(ctx, typicalRecord(i, 40), record.StateSuccess); err != nil {
			t.Fatal(err)
		}
	}
	n := mustNode(t, k)
	light, _ := status.FromNode(n)
	if len(light.History) != 3 || len(light.History[1].EvictedPods) >= 40 || len(light.LastChange.EvictedPods) == 40 {
		t.Fatalf("the Node's records are not light: %+v", light.History[1])
	}
	whole, _, found, err := published.ReadHistory(ctx, k.Client, "ns", "n1")
	if err != nil || !found {
		t.Fatal(found, err)
	}
	st, _ := status.WithHistory(n, whole, "ConfigMap ns/n1-mig-history")
	if len(st.History) != 3 || len(st.History[1].EvictedPods) != 40 || len(st.LastChange.EvictedPods) != 40 ||
		st.HistoryFrom != "ConfigMap ns/n1-mig-history" || len(st.GPUs) != 8 {
		t.Errorf("status with the whole history: %d records, %d pods in the second, %d in the last change, from %q, %d GPUs",
			len(st.History), len(st.History[1].EvictedPods), len(st.LastChange.EvictedPods), st.HistoryFrom, len(st.GPUs))
	}
	var b strings.Builder
	if err := status.WriteText(&b, st); err != nil || !strings.Contains(b.String(), "History (newest first):\n  (the records whole, from ConfigMap ns/n1-mig-history)") {
		t.Errorf("status text: %v\n%s", err, b.String())
	}
}

// A Node upgraded from an agent that kept its records whole on the Node
// turns light at the first change: the ConfigMap starts with those records
// whole, and the Node's entries for them become light ones that point to
// it. An entry the ConfigMap does not hold (this agent's, written whole
// while the ConfigMap refused it) stays whole on the Node: nothing of a
// record is ever only in neither place.
func TestUpgradedNodeTurnsLight(t *testing.T) {
	ctx := context.Background()
	var olds []record.ChangeRecord
	for i := range 3 {
		olds = append(olds, typicalRecord(10-i, 40))
	}
	oldJSON, _ := json.Marshal(olds)
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1",
		Annotations: map[string]string{record.AnnotationHistory: string(oldJSON)}}})
	refuse := true
	c.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if refuse {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "n1-mig-history", nil)
		}
		return false, nil, nil
	})
	k := &Cluster{Client: clientset.Wrap(c), Node: "n1", Namespace: "ns", Clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	before := len(mustNode(t, k).Annotations[record.AnnotationHistory])

	// The ConfigMap refused: the new record is whole on the Node, the old
	// ones stay whole.
	if err := k.Record(ctx, typicalRecord(11, 40), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	for i, r := range record.Trail(mustNode(t, k).Annotations) {
		if r.FullRecord != "" || len(r.EvictedPods) != 40 {
			t.Fatalf("entry %d light while the ConfigMap holds nothing: %+v", i, r)
		}
	}
	// The ConfigMap writable: it starts with the Node's four records whole,
	// and the newest record.NodeHistoryMaxRecords of the five are light on
	// the Node.
	refuse = false
	if err := k.Record(ctx, typicalRecord(12, 40), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	whole, _, _, err := published.ReadHistory(ctx, k.Client, "ns", "n1")
	if err != nil || len(whole) != 5 {
		t.Fatalf("the ConfigMap holds %d records (%v), want 5", len(whole), err)
	}
	for i, r := range whole {
		if len(r.EvictedPods) != 40 || r.FullRecord != "" {
			t.Errorf("ConfigMap record %d not whole: %d pods, fullRecord %q", i, len(r.EvictedPods), r.FullRecord)
		}
	}
	n := mustNode(t, k)
	onNode := record.Trail(n.Annotations)
	if len(onNode) != record.NodeHistoryMaxRecords {
		t.Fatalf("the Node's history has %d entries, want %d", len(onNode), record.NodeHistoryMaxRecords)
	}
	for i, r := range onNode {
		if r.FullRecord != "ConfigMap ns/n1-mig-history" || r.EvictedPodCount != 40 || len(r.EvictedPods) == 40 || r.Geometry != nil ||
			!r.StartedAt.Equal(whole[i].StartedAt) || r.Config != whole[i].Config {
			t.Errorf("Node entry %d not the light form of ConfigMap record %d: %+v", i, i, r)
		}
	}
	if after := len(n.Annotations[record.AnnotationHistory]); after >= before {
		t.Errorf("the Node's history is %d bytes with five records, %d with the three whole ones before", after, before)
	}

	// Refused again: the new whole entry stays whole when, later, the
	// ConfigMap takes records again (it never held that one).
	refuse = true
	if err := k.Record(ctx, typicalRecord(13, 40), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	refuse = false
	if err := k.Record(ctx, typicalRecord(14, 40), record.StateSuccess); err != nil {
		t.Fatal(err)
	}
	onNode = record.Trail(mustNode(t, k).Annotations)
	if len(onNode) < 2 || onNode[0].FullRecord == "" || onNode[1].FullRecord != "" || len(onNode[1].EvictedPods) != 40 {
		t.Errorf("the entry only the Node holds was made light, or the newest was not: %+v", onNode[:2])
	}
}
