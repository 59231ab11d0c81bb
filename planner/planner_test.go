package planner

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/kubefake"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

func optedIn(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		LabelOptIn: OptInValue, LabelGPUProduct: "NVIDIA-H200", LabelGPUCount: "2"}}}
}

func pendingPodObj(name, profile string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceName(ResourcePrefix + profile): resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable}}}}
}

func newTestPlanner(t *testing.T, dry bool, objs ...runtime.Object) (*Planner, *fake.Clientset, *bytes.Buffer) {
	t.Helper()
	c := fake.NewClientset(objs...)
	kubefake.NameEvents(c)
	out := &bytes.Buffer{}
	return &Planner{Client: clientset.Wrap(c), Namespace: "mig-agent", Spec: testSpec(t), DryRun: dry, Out: out,
		Log: testsupport.Discard(), Clock: clocktesting.NewFakeClock(time.Unix(5000, 0)), Identity: "test",
		Options: Options{Allowed: []string{"all-3g.71gb", "first-3g"}, MaxConcurrent: 1, HoldTime: time.Minute}}, c, out
}

func events(t *testing.T, c *fake.Clientset, reason string) []corev1.Event {
	t.Helper()
	l, err := c.CoreV1().Events("ml").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// --dry-run prints the change and why, and changes nothing.
func TestRoundDryRun(t *testing.T) {
	p, c, out := newTestPlanner(t, true, optedIn("n1"), pendingPodObj("a", "3g.71gb"), pendingPodObj("b", "7g.141gb"))
	if _, err := p.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"would set nvidia.com/mig.config=first-3g on node n1 (GPUs 0)", "for ml/a", "unservable ml/b: " + WhyUnknownProfile} {
		if !strings.Contains(s, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, s)
		}
	}
	n, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if n.Labels[record.LabelConfig] != "" || len(events(t, c, ReasonPlanned))+len(events(t, c, ReasonUnservable)) != 0 {
		t.Errorf("a dry run changed something: %v", n.Labels)
	}
}

// A round sets the label and nothing else, under the planner's field
// manager, writes the Events; the next rounds repeat neither the change nor
// the Unservable Event.
func TestRoundAppliesOnce(t *testing.T) {
	p, c, _ := newTestPlanner(t, false, optedIn("n1"), pendingPodObj("a", "3g.71gb"), pendingPodObj("b", "7g.141gb"))
	p.Metrics = metrics.NewPlanner()
	for range 3 {
		if _, err := p.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	n, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if n.Labels[record.LabelConfig] != "first-3g" || len(n.Annotations) != 0 {
		t.Errorf("node: labels %v annotations %v", n.Labels, n.Annotations)
	}
	if ev := events(t, c, ReasonPlanned); len(ev) != 1 || !strings.Contains(ev[0].Message, "node n1, GPU(s) 0, config first-3g") {
		t.Errorf("Planned Events: %v", ev)
	}
	l, _ := c.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if len(l.Items) != 1 || l.Items[0].InvolvedObject.Kind != "Node" || l.Items[0].Reason != ReasonPlanned || !strings.Contains(l.Items[0].Message, "for ml/a") {
		t.Errorf("Node Events: %v", l.Items)
	}
	if ev := events(t, c, ReasonUnservable); len(ev) != 1 || ev[0].InvolvedObject.Name != "b" {
		t.Errorf("Unservable Events: %v", ev)
	}
	patches := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
			patches++
			pa := a.(k8stesting.PatchActionImpl)
			if pa.PatchOptions.FieldManager != record.PlannerFieldManager || string(pa.Patch) != `{"metadata":{"labels":{"nvidia.com/mig.config":"first-3g"}}}` {
				t.Errorf("patch %s as %q, want the label alone as %s", pa.Patch, pa.PatchOptions.FieldManager, record.PlannerFieldManager)
			}
		}
	}
	if patches != 1 {
		t.Errorf("%d node patches over three rounds, want 1", patches)
	}
}

// One replica holds the Lease; another takes it only once the holder has
// not renewed it for the Lease's duration, by its own clock.
func TestElector(t *testing.T) {
	c := clientset.Wrap(fake.NewClientset())
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	mk := func(id string) *Elector {
		return &Elector{Client: c, Namespace: "ns", Name: "planner", Identity: id, LeaseDuration: 15 * time.Second,
			RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, Clock: clk, Log: testsupport.Discard()}
	}
	a, b := mk("a"), mk("b")
	ctx := context.Background()
	if !a.try(ctx) {
		t.Fatal("a did not take a free Lease")
	}
	if b.try(ctx) {
		t.Fatal("b took a held Lease")
	}
	clk.Step(10 * time.Second)
	if !a.try(ctx) || b.try(ctx) {
		t.Fatal("a could not renew, or b took a renewed Lease")
	}
	clk.Step(16 * time.Second) // a stopped renewing
	if !b.try(ctx) {
		t.Fatal("b did not take an expired Lease")
	}
	if a.try(ctx) {
		t.Fatal("a took back b's Lease")
	}
	b.release()
	if !a.try(ctx) {
		t.Fatal("a did not take a released Lease")
	}
}

// A node whose label its agent has not applied yet is in flight: with
// --max-concurrent 1 no other node changes.
func TestRoundCountsUnappliedLabelInFlight(t *testing.T) {
	busy := optedIn("n0")
	busy.Labels[record.LabelConfig] = "first-3g" // no state yet: its agent has not acted
	p, c, _ := newTestPlanner(t, false, busy, optedIn("n1"), pendingPodObj("a", "3g.71gb"))
	out, err := p.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Decisions) != 0 {
		t.Errorf("decisions %+v with a node in flight and --max-concurrent 1", out.Decisions)
	}
	n, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if n.Labels[record.LabelConfig] != "" {
		t.Errorf("n1 changed: %v", n.Labels)
	}
}

// When the planner last changed a node is when the API server recorded its
// write of the label (the managedFields entry of FieldManager that owns
// it), or, newer, what this planner remembers; a person's write of the
// label is not the planner's change.
func TestPlannedAt(t *testing.T) {
	owns := metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)
	at := metav1.NewTime(time.Unix(4900, 0))
	byPlanner, byPerson := optedIn("n1"), optedIn("n2")
	byPlanner.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationUpdate, Time: &at, FieldsV1: owns}}
	byPerson.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl-label", Operation: metav1.ManagedFieldsOperationUpdate, Time: &at, FieldsV1: owns}}
	p, _, _ := newTestPlanner(t, false, byPlanner, byPerson, optedIn("n3"))
	nodes, err := Nodes(context.Background(), p.Client, p.Spec, p.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 || !nodes[0].PlannedAt.Equal(at.Time) || !nodes[1].PlannedAt.IsZero() || !nodes[2].PlannedAt.IsZero() {
		t.Fatalf("PlannedAt: %v", nodes)
	}
	p.changed = map[string]time.Time{"n1": time.Unix(4950, 0), "n3": time.Unix(4960, 0)}
	p.remember(nodes)
	if !nodes[0].PlannedAt.Equal(time.Unix(4950, 0)) || !nodes[1].PlannedAt.IsZero() || !nodes[2].PlannedAt.Equal(time.Unix(4960, 0)) {
		t.Fatalf("PlannedAt with memory: %v, %v, %v", nodes[0].PlannedAt, nodes[1].PlannedAt, nodes[2].PlannedAt)
	}
}

// A round with no pending pod reads nothing but the pods: one request,
// whatever the number of opted-in nodes.
func TestRoundIdleReadsOnlyPods(t *testing.T) {
	p, c, _ := newTestPlanner(t, false, optedIn("n1"), optedIn("n2"))
	p.Metrics = metrics.NewPlanner()
	out, err := p.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Decisions)+len(out.Unservable)+len(out.Waiting) != 0 {
		t.Errorf("outcome %+v", out)
	}
	if a := c.Actions(); len(a) != 1 || a[0].GetVerb() != "list" || a[0].GetResource().Resource != "pods" {
		t.Errorf("requests of an idle round: %v", a)
	}
}
