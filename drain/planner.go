package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/record"
)

// ErrPlannerWouldEvict: the planner (`mig-agent planner`) asked for the
// change, and it would now evict pods (one landed on the GPUs since the
// planner decided). The planner's changes never evict: the agent refuses it.
var ErrPlannerWouldEvict = errors.New("the planner asked for this change and it would evict running pods: refused")

// plannerRefuses is ErrPlannerWouldEvict when pods would be evicted by a
// change the planner asked for: the Node's annotation
// planner.migagent.io/requested names the config its label asks for (the
// planner writes both at once; a person who sets the label to another
// config asks for a change of their own).
func (d *Disruptor) plannerRefuses(ctx context.Context, pods []string) error {
	if len(pods) == 0 {
		return nil
	}
	n := d.cachedNode(ctx)
	if n == nil {
		var err error
		if n, err = d.Client.CoreV1().Nodes().Get(ctx, d.Node, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading the Node to tell who asked for the change: %w", err)
		}
	}
	want := n.Labels[record.LabelConfig]
	if want == "" || n.Annotations[record.AnnotationPlannerRequested] != want {
		return nil
	}
	return fmt.Errorf("%w (config %s; it would evict %s; remove the annotation %s to let the agent evict)",
		ErrPlannerWouldEvict, want, strings.Join(pods, ", "), record.AnnotationPlannerRequested)
}
