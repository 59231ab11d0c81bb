package drain

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/internal/kclient/clientset"
	"github.com/migagent/mig-agent/internal/testsupport"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
)

// A change the planner asked for (its annotation names the label's config)
// that would evict is refused; one a person asked for, or one that evicts
// nothing, is not.
func TestPlannerRefusesToEvict(t *testing.T) {
	for _, tc := range []struct {
		name       string
		label, ann string
		pods       []string
		refused    bool
	}{
		{name: "planner, pods", label: "first-3g", ann: "first-3g", pods: []string{"ml/run"}, refused: true},
		{name: "planner, no pods", label: "first-3g", ann: "first-3g"},
		{name: "a person asked since", label: "all-1g.18gb", ann: "first-3g", pods: []string{"ml/run"}},
		{name: "no planner", label: "first-3g", pods: []string{"ml/run"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{record.LabelConfig: tc.label}}}
			if tc.ann != "" {
				n.Annotations = map[string]string{record.AnnotationPlannerRequested: tc.ann}
			}
			d := &Disruptor{Client: clientset.Wrap(fake.NewClientset(n)), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
			err := d.plannerRefuses(context.Background(), tc.pods)
			if got := errors.Is(err, ErrPlannerWouldEvict); got != tc.refused {
				t.Errorf("refused = %v (%v), want %v", got, err, tc.refused)
			}
		})
	}
}
