// Package planner is `mig-agent planner`: it reshapes the MIG geometry of
// opted-in, idle GPUs for the MIG devices pending pods ask for. It reads
// pods the scheduler could not place (PodScheduled=False, Unschedulable)
// that ask for nvidia.com/mig-<profile>, the nodes labelled
// migagent.io/planner=enabled (their geometry from their agents' change
// records, the devices in use from their agents' assignment trails), and
// the configs it may choose; it decides with the agents' own planner
// (geometry.BuildPlan) and refuses any change that would destroy a device
// in use. It only sets nvidia.com/mig.config, as a person would: each
// node's agent applies the change, within its rollout slots, and records
// the planner's identity as the requester.
//
// A pending pod counts only for the nodes it can be scheduled on (its node
// selector, node affinity and tolerations, by the scheduler's own helpers
// in k8s.io/component-helpers); its wants are bounded counts; a free device
// serves one pod once; a running pod is a GPU user by the agent's own rule
// (podresources.RequestsGPU).
//
// It may import client-go (through internal/kclient), component-helpers'
// scheduling helpers, geometry, profiles, record, kube (to read a node's
// records), drain (the agent's rule of a GPU resource) and assign (to read
// its trail).
package planner

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kevent"
	"github.com/migagent/mig-agent/record"
)

// Planner runs the rounds.
type Planner struct {
	Client    kclient.Interface
	Namespace string // the agents' namespace: their assignment trails
	Spec      *geometry.Spec
	Options   Options
	Interval  time.Duration
	DryRun    bool
	Out       io.Writer // --dry-run's report
	Log       *slog.Logger
	Clock     clock.Clock
	Metrics   Metrics // nil: none
	// Identity names the planner in its Events.
	Identity string

	planned    map[string]planned        // pod UID → the change that serves it
	changed    map[string]time.Time      // node → when this planner last set its label
	unservable map[string]string         // pod UID → the reason its Event gave
	silent     map[string]time.Time      // node → the label write its ReasonSilent Event was for
	watch      cache.SharedIndexInformer // the unbound pods (Run); nil or not synced: listed each round
}

type planned struct {
	node string
	at   time.Time
}

// Round reads the cluster, decides, and (unless DryRun) sets the labels and
// writes the Events.
func (p *Planner) Round(ctx context.Context) (Outcome, error) {
	if p.planned == nil {
		p.planned, p.unservable, p.changed = map[string]planned{}, map[string]string{}, map[string]time.Time{}
		p.silent = map[string]time.Time{}
	}
	unbound, err := p.unboundPods(ctx)
	if err != nil {
		return Outcome{}, err
	}
	pods, err := pendingFrom(ctx, p.Client, unbound)
	if err != nil {
		return Outcome{}, err
	}
	if len(pods) == 0 {
		// Nothing waits: the nodes are not read (two requests per
		// opted-in node), and the pods remembered are gone.
		out := Outcome{Unservable: map[string]string{}, Waiting: map[string]string{}}
		p.notPlanned(nil, nil, p.Clock.Now())
		if p.DryRun {
			p.report(out)
		} else {
			p.metrics().UnservablePods(0)
		}
		return out, nil
	}
	nodes, err := Nodes(ctx, p.Client, p.Spec, p.Namespace)
	if err != nil {
		return Outcome{}, err
	}
	now := p.Clock.Now()
	p.remember(nodes)
	p.silence(ctx, nodes, now)
	pods = p.notPlanned(pods, nodes, now)
	out := Decide(p.Spec, nodes, pods, now, p.Options)
	if p.DryRun {
		p.report(out)
		return out, nil
	}
	for _, d := range out.Decisions {
		if err := p.apply(ctx, d, now); err != nil {
			return out, err
		}
	}
	p.explain(ctx, pods, out)
	return out, nil
}

// remember sets each node's PlannedAt to when this planner changed it, where
// that is newer than the write of the label the API server recorded.
func (p *Planner) remember(nodes []*Node) {
	for _, n := range nodes {
		if at, ok := p.changed[n.Name]; ok && at.After(n.PlannedAt) {
			n.PlannedAt = at
		}
	}
}

// silence marks the nodes whose agent has not acted on their label within
// --node-act-timeout (Silence) and writes a Warning Event on each, once per
// label write.
func (p *Planner) silence(ctx context.Context, nodes []*Node, now time.Time) {
	for _, n := range Silence(nodes, now, p.Options) {
		if p.DryRun || p.silent[n.Name].Equal(n.LabelAt) {
			continue
		}
		p.silent[n.Name] = n.LabelAt
		msg := fmt.Sprintf("the node has not acted on %s=%s within %s of its write (is its agent running?): "+
			"no longer counted against --max-concurrent, and not planned for until it acts", record.LabelConfig, n.Desired, p.Options.ActTimeout)
		p.Log.Warn("planner: a node does not act on its label", "node", n.Name, "config", n.Desired, "since", n.LabelAt)
		p.write(ctx, kevent.NodeRef(n.Name, ""), corev1.EventTypeWarning, ReasonSilent, msg)
	}
}

// notPlanned drops the pods a change already under way serves, and
// remembers, per node, how many such pods still wait for it (Reserved):
// the node is not idle while they do.
func (p *Planner) notPlanned(pods []Pod, nodes []*Node, now time.Time) []Pod {
	pending := map[string]bool{}
	var out []Pod
	for _, pod := range pods {
		pending[pod.UID] = true
		pl, ok := p.planned[pod.UID]
		if !ok {
			out = append(out, pod)
			continue
		}
		i := slices.IndexFunc(nodes, func(n *Node) bool { return n.Name == pl.node })
		if i < 0 || nodes[i].Silent || (!nodes[i].InFlight && now.Sub(pl.at) > p.Options.HoldTime) {
			delete(p.planned, pod.UID) // its change is done and the scheduler still has no node: plan again
			out = append(out, pod)
			continue
		}
		nodes[i].Reserved++
	}
	for uid := range p.planned {
		if !pending[uid] {
			delete(p.planned, uid)
		}
	}
	for uid := range p.unservable {
		if !pending[uid] {
			delete(p.unservable, uid)
		}
	}
	return out
}

// apply sets node's label to the decision's config, and nothing else: the
// write's field manager (FieldManager) marks the change as the planner's.
func (p *Planner) apply(ctx context.Context, d Decision, now time.Time) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]string{record.LabelConfig: d.Config},
	}})
	if err != nil {
		return err
	}
	if _, err := p.Client.CoreV1().Nodes().Patch(ctx, d.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("setting %s=%s on node %s: %w", record.LabelConfig, d.Config, d.Node, err)
	}
	p.changed[d.Node] = now
	p.Log.Info("planner changed a node's geometry", "node", d.Node, "config", d.Config, "gpus", d.GPUs, "pods", len(d.Pods), "why", d.Why)
	p.metrics().Decision("changed")
	msg := fmt.Sprintf("node %s, GPU(s) %s, config %s: %s", d.Node, ints(d.GPUs), d.Config, d.Why)
	names := make([]string, len(d.Pods))
	for i, pod := range d.Pods {
		names[i] = pod.Key()
	}
	p.write(ctx, kevent.NodeRef(d.Node, ""), corev1.EventTypeNormal, ReasonPlanned, msg+"; for "+strings.Join(names, ", "))
	for _, pod := range d.Pods {
		p.planned[pod.UID] = planned{node: d.Node, at: now}
		delete(p.unservable, pod.UID)
		p.event(ctx, pod, corev1.EventTypeNormal, ReasonPlanned, msg)
		if !pod.Pending.IsZero() {
			p.metrics().Planned(now.Sub(pod.Pending))
		}
	}
	return nil
}

// explain writes MigGeometryUnservable once per pod and reason.
func (p *Planner) explain(ctx context.Context, pods []Pod, out Outcome) {
	n := 0
	for _, pod := range pods {
		why, ok := out.Unservable[pod.Key()]
		if !ok {
			continue
		}
		n++
		if p.unservable[pod.UID] == why {
			continue
		}
		p.unservable[pod.UID] = why
		p.metrics().Decision("unservable")
		p.Log.Info("planner cannot serve a pending pod", "pod", pod.Key(), "why", why)
		p.event(ctx, pod, corev1.EventTypeWarning, ReasonUnservable, why)
	}
	p.metrics().UnservablePods(n)
}

func (p *Planner) event(ctx context.Context, pod Pod, typ, reason, msg string) {
	p.write(ctx, kevent.PodRef(pod.Namespace, pod.Name, pod.UID), typ, reason, msg)
}

// write posts one Event about ref.
func (p *Planner) write(ctx context.Context, ref corev1.ObjectReference, typ, reason, msg string) {
	poster := kevent.Poster{Client: p.Client, Component: "mig-agent-planner", Controller: "migagent.io/mig-agent-planner", Instance: p.Identity}
	if err := poster.Post(ctx, p.Clock.Now(), ref, typ, reason, msg, false); err != nil {
		p.Log.Warn("planner could not write an Event", "kind", ref.Kind, "name", ref.Name, "reason", reason, "err", err)
	}
}

// report prints a dry run: what the planner would change and why.
func (p *Planner) report(out Outcome) {
	w := p.Out
	if len(out.Decisions) == 0 {
		fmt.Fprintln(w, "no change")
	}
	for _, d := range out.Decisions {
		names := make([]string, len(d.Pods))
		for i, pod := range d.Pods {
			names[i] = pod.Key()
		}
		fmt.Fprintf(w, "would set %s=%s on node %s (GPUs %s): %s; for %s\n", record.LabelConfig, d.Config, d.Node, ints(d.GPUs), d.Why, strings.Join(names, ", "))
	}
	for _, k := range sortedKeys(out.Unservable) {
		fmt.Fprintf(w, "unservable %s: %s\n", k, out.Unservable[k])
	}
	for _, k := range sortedKeys(out.Waiting) {
		fmt.Fprintf(w, "waiting %s: %s\n", k, out.Waiting[k])
	}
	for _, n := range out.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
