package planner

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/migagent/mig-agent/geometry"
)

// Pod is a pending pod that asks for MIG devices.
type Pod struct {
	Namespace, Name, UID string
	Created              time.Time
	// Pending is since when the scheduler has found no node for it (the
	// PodScheduled condition's last transition).
	Pending time.Time
	// Wants counts the MIG devices it asks for, by profile ("3g.71gb"),
	// each count bounded by MaxWant (AddWant).
	Wants map[string]int
	// lands says why the pod cannot be scheduled on a node ("" it can):
	// its node selector, required node affinity, and the node's taints
	// against its tolerations (nil: anywhere).
	lands func(*corev1.Node) string
}

// MaxWant bounds a pod's count of one profile: a sum that would pass it
// stays at it. No node offers that many; a pod asking for it is
// unservable, and said so.
const MaxWant = 1 << 20

// AddWant adds n devices of prof to w, bounded by MaxWant: limits that
// would overflow a sum (two containers at 2^63-1 each) never wrap to a
// negative want. n <= 0 adds nothing.
func AddWant(w map[string]int, prof string, n int64) {
	if n <= 0 {
		return
	}
	w[prof] = int(min(int64(w[prof])+min(n, MaxWant), MaxWant))
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
	// Changing: the agent acts on the label (state pending or rebooting);
	// LabelAt is when the label was last written (the Node's
	// managedFields). Silent: in flight without Changing for longer than
	// Options.ActTimeout since LabelAt (Silence sets it).
	Changing bool
	LabelAt  time.Time
	Silent   bool
	// InUse are the MIG devices held by running pods.
	InUse []InUse
	// Unlocated names running pods that hold GPU resources the node's agent
	// has not (yet) published a device for: the planner cannot tell which
	// GPU they use, so it changes nothing on the node.
	Unlocated []string
	// Unreadable says why the node's geometry is unknown (no model, no
	// record): the planner leaves it alone. Note is what a person should
	// know of how it was read (GFD's label disagrees, an older agent).
	Unreadable, Note string
	// PlannedAt is when the planner last changed the node (zero: never);
	// Reserved counts pods planned onto it that are still pending.
	PlannedAt time.Time
	Reserved  int
	// obj is the Node as read (nil: anything lands on it; tests).
	obj *corev1.Node
}

// Options bound the decisions.
type Options struct {
	// Allowed are the configs the planner may choose, in the order given.
	Allowed []string
	// MaxConcurrent is how many opted-in nodes may be in flight at once
	// (0: 1).
	MaxConcurrent int
	// HoldTime: a node the planner changed is not changed again within it,
	// idle or not (a tenant who deletes the pod it was changed for frees
	// nothing early): at most one planner change per node per HoldTime.
	HoldTime time.Duration
	// ActTimeout: a node whose agent has not acted on its label (state
	// pending or rebooting, or the config applied) this long after the
	// label was written is silent: no longer in flight for MaxConcurrent,
	// and not planned for until it acts (0: never).
	ActTimeout time.Duration
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
	WhyTooLarge       = "it asks for more devices of a profile than any allowed config offers on any opted-in node"
	WhyNoFit          = "it cannot be scheduled on any opted-in node"
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
	// offers counts the MIG devices of the planned geometry by profile;
	// supply those of them free (not in use, not yet given to a pending
	// pod this round).
	offers, supply map[string]int
}

// Decide plans one round: at most MaxConcurrent nodes in flight, each
// change the one that serves the most pending pods (oldest first), then
// touches the fewest GPUs, then the fewest instances, then the node name
// and the config name, in that order. A pod counts only for the nodes it
// can be scheduled on. A free device serves one pending pod, once. It
// never returns a change whose plan destroys a device in use. It is pure:
// the same inputs give the same outcome. A round costs O(pods × candidates)
// (times --max-concurrent for the changes).
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
		if n.InFlight && !n.Silent {
			slots--
		}
	}
	cands, notes := candidates(spec, nodes, o.Allowed)
	out.Notes = notes
	r := &round{cands: cands, all: cands, decided: map[*Node]bool{}, fit: fits(pods, nodes), now: now, o: o}
	left := r.freeNow(pods, out.Waiting)
	for slots > 0 && len(left) > 0 {
		best, served := r.pick(left)
		if best == nil {
			break
		}
		out.Decisions = append(out.Decisions, Decision{Node: best.node.Name, Config: best.config, GPUs: best.gpus,
			Instances: best.instances, Pods: served, Why: why(best, served)})
		slots--
		r.decided[best.node] = true
		r.cands = slices.DeleteFunc(slices.Clone(r.cands), func(c *candidate) bool { return c.node == best.node })
		done := make(map[string]bool, len(served))
		for _, p := range served {
			done[p.UID] = true
		}
		left = slices.DeleteFunc(left, func(p Pod) bool { return done[p.UID] })
	}
	for _, p := range left {
		reason, unservable := r.whyNot(nodes, p, slots > 0)
		if unservable {
			out.Unservable[p.Key()] = reason
		} else {
			out.Waiting[p.Key()] = reason
		}
	}
	return out
}

// Silence marks the nodes in flight whose agent has not acted on the label
// within o.ActTimeout (Node.Silent) and returns them.
func Silence(nodes []*Node, now time.Time, o Options) []*Node {
	var out []*Node
	for _, n := range nodes {
		if o.ActTimeout > 0 && n.InFlight && !n.Changing && !n.LabelAt.IsZero() && now.Sub(n.LabelAt) > o.ActTimeout {
			n.Silent = true
			out = append(out, n)
		}
	}
	return out
}

// round is what one Decide works on.
type round struct {
	cands []*candidate // those still open to a change this round
	all   []*candidate
	// decided are the nodes a change of this round goes to.
	decided map[*Node]bool
	fit     map[string]map[string]string // pod UID → node → why it cannot land there (absent: it can)
	now     time.Time
	o       Options
}

// fits says, per pod and node, why the pod cannot be scheduled there:
// O(pods × nodes), once per round.
func fits(pods []Pod, nodes []*Node) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, p := range pods {
		if p.lands == nil {
			continue
		}
		for _, n := range nodes {
			if n.obj == nil {
				continue
			}
			if why := p.lands(n.obj); why != "" {
				if out[p.UID] == nil {
					out[p.UID] = map[string]string{}
				}
				out[p.UID][n.Name] = why
			}
		}
	}
	return out
}

// lands: p may be scheduled on n.
func (r *round) lands(p Pod, n *Node) bool { return r.fit[p.UID][n.Name] == "" }

// freeNow gives each pod (oldest first) a free device that exists now, on
// a node it can land on, where one is left: such a pod needs no change, the
// scheduler places it. The device is then used up, on every candidate of
// its node: it serves one pod, once. It returns the pods left.
func (r *round) freeNow(pods []Pod, waiting map[string]string) []Pod {
	var left []Pod
	for _, p := range pods {
		var got *candidate
		for _, c := range r.cands {
			if len(c.gpus) == 0 && usable(c, r.now, r.o, true) && r.lands(p, c.node) && enough(c.supply, p.Wants) {
				got = c
				break
			}
		}
		if got == nil {
			left = append(left, p)
			continue
		}
		waiting[p.Key()] = "node " + got.node.Name + " already offers it without a change"
		for _, c := range r.cands {
			if c.node == got.node {
				for prof, n := range p.Wants {
					c.supply[prof] -= n
				}
			}
		}
	}
	return left
}

// enough: free holds the devices wants asks for.
func enough(free, wants map[string]int) bool {
	for prof, n := range wants {
		if free[prof] < n {
			return false
		}
	}
	return true
}

func why(c *candidate, served []Pod) string {
	return fmt.Sprintf("serves %d pending pod(s), touches %d GPU(s) and %d instance(s), destroys no MIG device in use", len(served), len(c.gpus), c.instances)
}

// candidates plans every allowed config on every readable node.
func candidates(spec *geometry.Spec, nodes []*Node, allowed []string) ([]*candidate, []string) {
	var out []*candidate
	var notes []string
	for _, n := range nodes {
		if n.Note != "" {
			notes = append(notes, fmt.Sprintf("node %s: %s", n.Name, n.Note))
		}
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
	c := &candidate{node: n, config: cfg, offers: map[string]int{}, supply: map[string]int{}}
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
				c.offers[name]++
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
	held := !c.node.PlannedAt.IsZero() && now.Sub(c.node.PlannedAt) < o.HoldTime
	return slot && !held && c.node.Reserved == 0 && !c.node.Silent
}

// serves fills the candidate's free devices with the pods that can land on
// its node, oldest first.
func (r *round) serves(c *candidate, pods []Pod) []Pod {
	free := maps.Clone(c.supply)
	var out []Pod
	for _, p := range pods {
		if !r.lands(p, c.node) || !enough(free, p.Wants) {
			continue
		}
		for prof, n := range p.Wants {
			free[prof] -= n
		}
		out = append(out, p)
	}
	return out
}

// pick is the best usable change for pods and the pods it serves.
func (r *round) pick(pods []Pod) (*candidate, []Pod) {
	var best *candidate
	var bestServed []Pod
	for _, c := range r.cands {
		if len(c.gpus) == 0 || !usable(c, r.now, r.o, true) {
			continue
		}
		served := r.serves(c, pods)
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
func (r *round) whyNot(nodes []*Node, p Pod, slot bool) (string, bool) {
	var offered, large, evicting, blocked bool
	var evicts []string
	for _, c := range r.all {
		if !r.lands(p, c.node) {
			continue
		}
		known, fits := true, true
		for prof, n := range p.Wants {
			known = known && c.offers[prof] > 0
			fits = fits && c.offers[prof] >= n
		}
		offered = offered || known
		large = large || fits
		if len(r.serves(c, []Pod{p})) == 0 {
			continue
		}
		switch {
		case len(c.evicts) > 0:
			evicting = true
			evicts = append(evicts, fmt.Sprintf("%s on %s: %s", c.config, c.node.Name, strings.Join(c.evicts, "; ")))
		case !usable(c, r.now, r.o, slot) || len(c.gpus) == 0 || r.decided[c.node]:
			blocked = true
		}
	}
	switch {
	case blocked:
		return "the nodes that could serve it are changing, held, or over --max-concurrent: later", false
	case evicting:
		slices.Sort(evicts)
		return WhyWouldEvict + ": " + strings.Join(evicts, "; "), true
	case !slices.ContainsFunc(nodes, func(n *Node) bool { return r.lands(p, n) }):
		return WhyNoFit + ": " + r.noFit(p, nodes), true
	case !offered:
		return WhyUnknownProfile + " (" + wantsString(p.Wants) + ")", true
	case !large:
		return WhyTooLarge + " (" + wantsString(p.Wants) + ")", true
	}
	return WhyTooMany + " (" + wantsString(p.Wants) + ")", true
}

// noFit names, for the first few nodes, why p cannot land there.
func (r *round) noFit(p Pod, nodes []*Node) string {
	var parts []string
	for _, n := range nodes {
		if len(parts) == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(nodes)-3))
			break
		}
		parts = append(parts, n.Name+": "+r.fit[p.UID][n.Name])
	}
	return strings.Join(parts, "; ")
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
