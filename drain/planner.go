package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/labelwriter"
	"github.com/migagent/mig-agent/record"
)

// ErrPlannerWouldEvict: the planner (`mig-agent planner`) asked for the
// change, and it would now evict pods (one landed on the GPUs since the
// planner decided). The planner's changes never evict: the agent refuses it.
var ErrPlannerWouldEvict = errors.New("the planner asked for this change and it would evict running pods: refused")

// ErrPlannerNotOptedIn: the planner asked for the change (plannerAsked) on
// a node without the label migagent.io/planner=enabled. The planner never
// does that; a token that writes as the planner on any Node (stolen, or
// a client naming itself so) gets nothing applied.
var ErrPlannerNotOptedIn = errors.New("the planner asked for this change on a node that has not opted in (label " +
	record.LabelPlannerOptIn + "=" + record.PlannerOptInValue + "): refused")

// plannerRefuses is ErrPlannerNotOptedIn when the planner asked for the
// change on a node that has not opted in, and ErrPlannerWouldEvict when
// pods would be evicted by a change the planner asked for (plannerAsked).
func (d *Disruptor) plannerRefuses(ctx context.Context, pods []string) error {
	n := d.cachedNode(ctx)
	if n == nil {
		var err error
		if n, err = d.Client.CoreV1().Nodes().Get(ctx, d.Node, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading the Node to tell who asked for the change: %w", err)
		}
	}
	want := n.Labels[record.LabelConfig]
	how, asked := plannerAsked(n, want)
	if want == "" || !asked {
		return nil
	}
	if n.Labels[record.LabelPlannerOptIn] != record.PlannerOptInValue {
		return fmt.Errorf("%w (config %s; %s; to apply it, set the label %s yourself)", ErrPlannerNotOptedIn, want, how, record.LabelConfig)
	}
	if len(pods) == 0 {
		return nil
	}
	return fmt.Errorf("%w (config %s; it would evict %s; %s; to let the agent evict, remove the label %s and set it again yourself)",
		ErrPlannerWouldEvict, want, strings.Join(pods, ", "), how, record.LabelConfig)
}

// plannerAsked says whether the planner wrote want, the value of node's
// desired label, and how the agent knows: the managedFields entry that owns
// the label is the planner's field manager (record.PlannerFieldManager), or
// the requester stamp for that value names it as the write's field manager.
// Either is a name the client chose, and it is trusted in one direction
// only: a write that claims to be the planner's makes the agent refuse to
// evict for it, never evict more. Anyone who may write the label can stop a
// change anyway, by setting another value.
func plannerAsked(node *corev1.Node, want string) (string, bool) {
	if m, _, ok := labelwriter.Of(node.ManagedFields, record.LabelConfig); ok && m == record.PlannerFieldManager {
		return "the label was last written by the field manager " + m, true
	}
	var s record.RequesterStamp
	if raw, ok := node.Annotations[record.AnnotationRequestedBy]; ok && json.Unmarshal([]byte(raw), &s) == nil &&
		s.Config == want && s.Via == record.PlannerFieldManager {
		return fmt.Sprintf("the requester stamp names %s writing it as %s", s.User, s.Via), true
	}
	return "", false
}
