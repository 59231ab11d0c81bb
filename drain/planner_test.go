package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// A change the planner asked for (its field manager wrote the label, or the
// requester stamp of the label's value names it) that would evict is
// refused; one a person asked for, or one that evicts nothing, is not.
func TestPlannerRefusesToEvict(t *testing.T) {
	owns := metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:nvidia.com/mig.config":{}}}}`)
	at := func(s int64) *metav1.Time { x := metav1.NewTime(time.Unix(s, 0)); return &x }
	wrote := func(manager string, s int64) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Time: at(s), FieldsV1: owns}
	}
	stamp := func(via, config string) string {
		return fmt.Sprintf(`{"user":"system:serviceaccount:mig-agent:planner","via":%q,"config":%q}`, via, config)
	}
	for _, tc := range []struct {
		name    string
		label   string
		fields  []metav1.ManagedFieldsEntry
		stamp   string
		pods    []string
		refused bool
		foreign bool // the node has not opted in
	}{
		{name: "planner, a node not opted in", label: "first-3g", fields: []metav1.ManagedFieldsEntry{wrote(record.PlannerFieldManager, 10)}, foreign: true},
		{name: "a person, a node not opted in", label: "first-3g", fields: []metav1.ManagedFieldsEntry{wrote("kubectl-label", 10)}, foreign: true, pods: []string{"ml/run"}},
		{name: "planner, pods", label: "first-3g", fields: []metav1.ManagedFieldsEntry{wrote(record.PlannerFieldManager, 10)}, pods: []string{"ml/run"}, refused: true},
		{name: "planner, no pods", label: "first-3g", fields: []metav1.ManagedFieldsEntry{wrote(record.PlannerFieldManager, 10)}},
		{name: "a person wrote it", label: "first-3g", fields: []metav1.ManagedFieldsEntry{wrote("kubectl-label", 10)}, pods: []string{"ml/run"}},
		{name: "a person applied it after the planner", label: "first-3g",
			fields: []metav1.ManagedFieldsEntry{wrote(record.PlannerFieldManager, 10), wrote("platform-team", 20)}, pods: []string{"ml/run"}},
		{name: "nothing names a writer", label: "first-3g", pods: []string{"ml/run"}},
		{name: "stamp names the planner", label: "first-3g", stamp: stamp(record.PlannerFieldManager, "first-3g"), pods: []string{"ml/run"}, refused: true},
		{name: "stamp of an earlier value", label: "first-3g", stamp: stamp(record.PlannerFieldManager, "all-1g.18gb"), pods: []string{"ml/run"}},
		{name: "stamp names a person", label: "first-3g", stamp: stamp("kubectl-label", "first-3g"), pods: []string{"ml/run"}},
		{name: "stamp unparsable", label: "first-3g", stamp: `{"user":`, pods: []string{"ml/run"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{record.LabelConfig: tc.label}, ManagedFields: tc.fields}}
			if !tc.foreign {
				n.Labels[record.LabelPlannerOptIn] = record.PlannerOptInValue
			}
			if tc.stamp != "" {
				n.Annotations = map[string]string{record.AnnotationRequestedBy: tc.stamp}
			}
			d := &Disruptor{Client: clientset.Wrap(fake.NewClientset(n)), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
			err := d.plannerRefuses(context.Background(), tc.pods)
			planners := tc.foreign && len(tc.fields) > 0 && tc.fields[0].Manager == record.PlannerFieldManager
			if got := errors.Is(err, ErrPlannerNotOptedIn); got != planners {
				t.Errorf("not opted in = %v (%v), want %v", got, err, planners)
			}
			if got := errors.Is(err, ErrPlannerWouldEvict); got != tc.refused {
				t.Errorf("refused = %v (%v), want %v", got, err, tc.refused)
			}
			if tc.refused && !strings.Contains(err.Error(), "ml/run") {
				t.Errorf("the reason names no pod: %v", err)
			}
		})
	}
}
