package planner

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/migagent/mig-agent/geometry"
)

// Pod is a pending pod that asks for MIG devices.
type Pod struct {
	Namespace, Name, UID string
	Created              time.Time
	// Pending is since when the scheduler has found no node for it (the
	// PodScheduled condition's last transition).
	Pending time.Time
	// Wants counts the MIG devices it asks for, by profile ("3g.71gb").
	Wants map[string]int
}

// Key is "namespace/name".
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// InUse is a MIG device a running pod holds, as the node's agent published
// it: its GPU and the start of its GPU instance.
type InUse struct {
	GPU     int
	Start   int
	Profile string
	Pod     string // namespace/name
}

// Node is what the planner knows of one opted-in node.
type Node struct {
	Name string
	// GPUs is the node's geometry now, as its agent recorded it.
	GPUs []geometry.GPU
	// Applied is the config of the node's newest successful change; Desired
	// its nvidia.com/mig.config label.
	Applied, Desired string
	// InFlight: a change is under way (state pending or rebooting, or the
	// label differs from what was applied and has not failed).
	InFlight bool
	// InUse are the MIG devices held by running pods.
	InUse []InUse
	// Unlocated names running pods that hold GPU resources the node's agent
	// has not (yet) published a device for: the planner cannot tell which
	// GPU they use, so it changes nothing on the node.
	Unlocated []string
	// Unreadable says why the node's geometry is unknown (no model, no
	// record): the planner leaves it alone.
	Unreadable string
	// PlannedAt is when the planner last changed the node (zero: never);
	// Reserved counts pods planned onto it that are still pending.
	PlannedAt time.Time
	Reserved  int
}

// idle: nothing runs on the node's GPUs and no planned pod waits for it.
func (n *Node) idle() bool { return len(n.InUse) == 0 && len(n.Unlocated) == 0 && n.Reserved == 0 }

// Options bound the decisions.
type Options struct {
	// Allowed are the configs the planner may choose, in the order given.
	Allowed []string
	// MaxConcurrent is how many opted-in nodes may be in flight at once
	// (0: 1).
	MaxConcurrent int
	// HoldTime: a node the planner changed is not changed again within it,
	// unless idle.
	HoldTime time.Duration
}

// Decision is one change: node's label set to Config.
type Decision struct {
	Node, Config string
	// GPUs are the indices of the GPUs the change touches; Instances counts
	// the GPU and compute instances it creates or destroys.
	GPUs      []int
	Instances int
	// Pods are the pending pods it serves ("namespace/name").
	Pods []Pod
	// Why says in words why this change won.
	Why string
}

// Unservable reasons.
const (
	WhyNoNode         = "no node has opted in (label migagent.io/planner=enabled)"
	WhyUnknownProfile = "no allowed config offers the profile on any opted-in node"
	WhyWouldEvict     = "every allowed change that would serve it destroys a MIG device in use (it would evict a running pod)"
	WhyTooMany        = "no allowed config gives enough free devices on any opted-in node"
)

// Outcome is what one round decided.
type Outcome struct {
	Decisions []Decision
	// Unservable are the pods no allowed change of any opted-in node can
	// serve, with why; Waiting the pods left for a later round (their only
	// candidates are in flight, held, or over --max-concurrent; or a node
	// already offers what they ask).
	Unservable map[string]string
	Waiting    map[string]string
	// Notes say why candidates were passed over, for --dry-run and the log.
	Notes []string
}

// candidate is one allowed config on one node.
type candidate struct {
	node      *Node
	config    string
	gpus      []int
	instances int
	evicts    []string // in-use devices it would destroy
	supply    map[string]int
}

// Decide plans one round: at most MaxConcurrent nodes in flight, each
// change the one that serves the most pending pods (oldest first), then
// touches the fewest GPUs, then the fewest instances, then the node name
// and the config name, in that order. It never returns a change whose plan
// destroys a device in use. It is pure: the same inputs give the same
// outcome.
func Decide(spec *geometry.Spec, nodes []*Node, pods []Pod, now time.Time, o Options) Outcome {
	out := Outcome{Unservable: map[string]string{}, Waiting: map[string]string{}}
	pods = slices.Clone(pods)
	slices.SortStableFunc(pods, func(a, b Pod) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Key(), b.Key()))
	})
	if len(nodes) == 0 {
		for _, p := range pods {
			out.Unservable[p.Key()] = WhyNoNode
		}
		return out
	}
	slots := max(o.MaxConcurrent, 1)
	for _, n := range nodes {
		if n.InFlight {
			slots--
		}
	}
	cands, notes := candidates(spec, nodes, o.Allowed)
	out.Notes = notes
	left := pods
	for len(left) > 0 {
		best, served := pick(cands, left, now, o, slots > 0)
		if best == nil {
			break
		}
		if len(best.gpus) == 0 {
			// A node already offers what these pods ask: nothing to change;
			// the scheduler will place them.
			for _, p := range served {
				out.Waiting[p.Key()] = "node " + best.node.Name + " already offers it without a change"
			}
		} else {
			out.Decisions = append(out.Decisions, Decision{Node: best.node.Name, Config: best.config, GPUs: best.gpus,
				Instances: best.instances, Pods: served, Why: why(best, served)})
			slots--
			cands = slices.DeleteFunc(cands, func(c *candidate) bool { return c.node == best.node })
		}
		left = slices.DeleteFunc(left, func(p Pod) bool { return slices.ContainsFunc(served, func(s Pod) bool { return s.UID == p.UID }) })
	}
	for _, p := range left {
		if _, done := out.Waiting[p.Key()]; !done {
			reason, unservable := whyNot(spec, nodes, cands, p, now, o, slots > 0)
			if unservable {
				out.Unservable[p.Key()] = reason
			} else {
				out.Waiting[p.Key()] = reason
			}
		}
	}
	return out
}

func why(c *candidate, served []Pod) string {
	return fmt.Sprintf("serves %d pending pod(s), touches %d GPU(s) and %d instance(s), destroys no MIG device in use", len(served), len(c.gpus), c.instances)
}

// candidates plans every allowed config on every readable node.
func candidates(spec *geometry.Spec, nodes []*Node, allowed []string) ([]*candidate, []string) {
	var out []*candidate
	var notes []string
	for _, n := range nodes {
		if n.Unreadable != "" {
			notes = append(notes, fmt.Sprintf("node %s: left alone: %s", n.Name, n.Unreadable))
			continue
		}
		for _, cfg := range allowed {
			p, err := geometry.BuildPlan(spec, cfg, n.GPUs)
			if err != nil {
				notes = append(notes, fmt.Sprintf("node %s: config %s does not apply: %v", n.Name, cfg, err))
				continue
			}
			if p.RebootNeeded {
				notes = append(notes, fmt.Sprintf("node %s: config %s needs a reboot: not chosen", n.Name, cfg))
				continue
			}
			out = append(out, candidateOf(n, cfg, p))
		}
	}
	return out, notes
}

// candidateOf measures one plan: the GPUs and instances it touches, the
// devices in use it destroys, the free devices per profile it leaves.
func candidateOf(n *Node, cfg string, p *geometry.Plan) *candidate {
	c := &candidate{node: n, config: cfg, supply: map[string]int{}}
	type at struct{ gpu, start int }
	destroyed := map[at]bool{}
	for _, gp := range p.GPUs {
		if gp.Action == geometry.ActionChange {
			c.gpus = append(c.gpus, gp.Index)
		}
		c.instances += len(gp.Destroy) + len(gp.Create) + len(gp.DestroyCompute) + len(gp.CreateCompute)
		for _, in := range gp.Destroy {
			destroyed[at{gp.Index, in.Start}] = true
		}
		for _, cc := range gp.DestroyCompute {
			destroyed[at{gp.Index, cc.Start}] = true
		}
		for _, in := range gp.Desired {
			for _, name := range computeNames(in) {
				c.supply[name]++
			}
		}
	}
	for _, u := range n.InUse {
		if destroyed[at{u.GPU, u.Start}] {
			c.evicts = append(c.evicts, fmt.Sprintf("%s on GPU %d (held by %s)", u.Profile, u.GPU, u.Pod))
		}
		c.supply[u.Profile]--
	}
	if len(n.Unlocated) > 0 && len(c.gpus) > 0 {
		c.evicts = append(c.evicts, "GPU resources of "+strings.Join(n.Unlocated, ", ")+" (devices not published by the node's agent)")
	}
	return c
}

// computeNames are the MIG devices an instance offers: one per compute
// instance, named by its profile, as the device plugin names them.
func computeNames(in geometry.Instance) []string {
	if in.Compute == nil {
		return []string{in.Profile}
	}
	return in.Compute
}

// usable: the candidate may be chosen now.
func usable(c *candidate, now time.Time, o Options, slot bool) bool {
	if len(c.evicts) > 0 || c.node.InFlight {
		return false
	}
	if len(c.gpus) == 0 {
		return true
	}
	held := !c.node.PlannedAt.IsZero() && now.Sub(c.node.PlannedAt) < o.HoldTime && !c.node.idle()
	return slot && !held && c.node.Reserved == 0
}

// serves fills the candidate's free devices with pods, oldest first.
func serves(c *candidate, pods []Pod) []Pod {
	free := maps(c.supply)
	var out []Pod
	for _, p := range pods {
		ok := true
		for prof, n := range p.Wants {
			if free[prof] < n {
				ok = false
			}
		}
		if !ok {
			continue
		}
		for prof, n := range p.Wants {
			free[prof] -= n
		}
		out = append(out, p)
	}
	return out
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// pick is the best usable candidate for pods and the pods it serves. A
// candidate that changes nothing and serves the oldest pod wins outright.
func pick(cands []*candidate, pods []Pod, now time.Time, o Options, slot bool) (*candidate, []Pod) {
	var best *candidate
	var bestServed []Pod
	for _, c := range cands {
		if !usable(c, now, o, slot) {
			continue
		}
		served := serves(c, pods)
		if len(served) == 0 {
			continue
		}
		if best == nil || better(c, served, best, bestServed) {
			best, bestServed = c, served
		}
	}
	return best, bestServed
}

func better(a *candidate, as []Pod, b *candidate, bs []Pod) bool {
	if (len(a.gpus) == 0) != (len(b.gpus) == 0) {
		return len(a.gpus) == 0
	}
	return cmp.Or(
		cmp.Compare(len(bs), len(as)),
		cmp.Compare(len(a.gpus), len(b.gpus)),
		cmp.Compare(a.instances, b.instances),
		cmp.Compare(a.node.Name, b.node.Name),
		cmp.Compare(a.config, b.config),
	) < 0
}

// whyNot says why no change serves p: unservable (no allowed change of any
// opted-in node could, now or later, without evicting) or waiting.
func whyNot(spec *geometry.Spec, nodes []*Node, cands []*candidate, p Pod, now time.Time, o Options, slot bool) (string, bool) {
	var offered, evicting, blocked bool
	var evicts []string
	for _, c := range cands {
		known := true
		for prof := range p.Wants {
			if c.supply[prof]+inUse(c.node, prof) <= 0 {
				known = false
			}
		}
		offered = offered || known
		if len(serves(c, []Pod{p})) == 0 {
			continue
		}
		switch {
		case len(c.evicts) > 0:
			evicting = true
			evicts = append(evicts, fmt.Sprintf("%s on %s: %s", c.config, c.node.Name, strings.Join(c.evicts, "; ")))
		case !usable(c, now, o, slot):
			blocked = true
		}
	}
	switch {
	case blocked:
		return "the nodes that could serve it are changing, held, or over --max-concurrent: later", false
	case evicting:
		slices.Sort(evicts)
		return WhyWouldEvict + ": " + strings.Join(evicts, "; "), true
	case !offered:
		return WhyUnknownProfile + " (" + wantsString(p.Wants) + ")", true
	}
	return WhyTooMany + " (" + wantsString(p.Wants) + ")", true
}

func inUse(n *Node, prof string) int {
	k := 0
	for _, u := range n.InUse {
		if u.Profile == prof {
			k++
		}
	}
	return k
}

func wantsString(w map[string]int) string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d× %s", w[k], k)
	}
	return strings.Join(parts, ", ")
}

var computePrefix = regexp.MustCompile(`^(\d+)c\.(.+)$`)

// ParseInstance reads a change record's "name@start" (Instance.Name: "3g.71gb",
// "1c.3g.71gb", "2c.3g.71gb+1c.3g.71gb", "3×1c.3g.71gb", "3g.71gb[none]")
// back into an instance.
func ParseInstance(s string) (geometry.Instance, error) {
	i := strings.LastIndexByte(s, '@')
	if i < 0 {
		return geometry.Instance{}, fmt.Errorf("instance %q: no @start", s)
	}
	start, err := strconv.Atoi(s[i+1:])
	if err != nil || start < 0 {
		return geometry.Instance{}, fmt.Errorf("instance %q: bad start", s)
	}
	name := s[:i]
	if gi, ok := strings.CutSuffix(name, "[none]"); ok {
		return geometry.Instance{Profile: gi, Start: start, Compute: []string{}}, nil
	}
	var cis []string
	gi := ""
	for _, part := range strings.Split(name, "+") {
		n := 1
		if k, rest, ok := strings.Cut(part, "×"); ok {
			if n, err = strconv.Atoi(k); err != nil || n < 1 {
				return geometry.Instance{}, fmt.Errorf("instance %q: bad count", s)
			}
			part = rest
		}
		g := part
		if m := computePrefix.FindStringSubmatch(part); m != nil {
			g = m[2]
		}
		if gi != "" && g != gi {
			return geometry.Instance{}, fmt.Errorf("instance %q: compute instances of two GPU instances", s)
		}
		gi = g
		for range n {
			cis = append(cis, part)
		}
	}
	in := geometry.Instance{Profile: gi, Start: start, Compute: cis}
	if len(cis) == 1 && cis[0] == gi {
		in.Compute = nil
	}
	return in, nil
}
