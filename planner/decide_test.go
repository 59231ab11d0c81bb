package planner

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

const testConfig = `version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.18gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.18gb: 7
  all-3g.71gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        3g.71gb: 2
  first-3g:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        3g.71gb: 2
  second-3g:
    - devices: [1]
      mig-enabled: true
      mig-devices:
        3g.71gb: 2
`

func testSpec(t *testing.T) *geometry.Spec {
	t.Helper()
	s, err := geometry.Parse([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// h200 builds a node of n H200s; layout per GPU: "" (MIG off) or
// instances "1g.18gb@0 1g.18gb@1 ...".
func h200(name string, layout ...string) *Node {
	m, _ := profiles.ModelByKey("h200")
	n := &Node{Name: name}
	for i, l := range layout {
		g := geometry.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: m.Name, PCIDeviceID: m.PCIDeviceID,
			Architecture: m.Architecture, MigCapable: true, CanReset: true, Catalogue: m.Catalogue}
		for _, s := range strings.Fields(l) {
			in, err := ParseInstance(s)
			if err != nil {
				panic(err)
			}
			g.Instances = append(g.Instances, in)
		}
		g.ModeCurrent, g.ModePending = len(g.Instances) > 0, len(g.Instances) > 0
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

const all1g = "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb@6"

func pod(name string, wants map[string]int, age int) Pod {
	return Pod{Namespace: "ml", Name: name, UID: "uid-" + name, Created: time.Unix(int64(1000+age), 0), Wants: wants}
}

func with(n *Node, f func(*Node)) *Node { f(n); return n }

func TestDecide(t *testing.T) {
	spec := testSpec(t)
	now := time.Unix(10000, 0)
	allowed := []string{"all-disabled", "all-1g.18gb", "all-3g.71gb", "first-3g", "second-3g"}
	want3g := map[string]int{"3g.71gb": 1}
	cases := []struct {
		name      string
		nodes     []*Node
		pods      []Pod
		opts      Options
		decisions []string // "node=config gpus=... pods=..."
		unserv    map[string]string
		waiting   []string
	}{
		{name: "no opted-in node", pods: []Pod{pod("a", want3g, 0)},
			unserv: map[string]string{"ml/a": WhyNoNode}},
		{name: "fewest GPUs: one GPU reshaped, not two", nodes: []*Node{h200("n1", "", "")}, pods: []Pod{pod("a", want3g, 0)},
			decisions: []string{"n1=first-3g gpus=[0] pods=[ml/a]"}},
		{name: "two pods one change", nodes: []*Node{h200("n1", "", "")}, pods: []Pod{pod("a", want3g, 0), pod("b", want3g, 1)},
			decisions: []string{"n1=first-3g gpus=[0] pods=[ml/a ml/b]"}},
		{name: "three pods: the change that serves most wins", nodes: []*Node{h200("n1", "", "")},
			pods:      []Pod{pod("a", want3g, 0), pod("b", want3g, 1), pod("c", want3g, 2)},
			decisions: []string{"n1=all-3g.71gb gpus=[0 1] pods=[ml/a ml/b ml/c]"}},
		{name: "the GPU in use is left alone", pods: []Pod{pod("a", want3g, 0)},
			nodes: []*Node{with(h200("n1", all1g, all1g), func(n *Node) {
				n.Applied = "all-1g.18gb"
				n.InUse = []InUse{{GPU: 0, Start: 3, Profile: "1g.18gb", Pod: "ml/run"}}
			})},
			decisions: []string{"n1=second-3g gpus=[1] pods=[ml/a]"}},
		{name: "every fitting change evicts", pods: []Pod{pod("a", want3g, 0)},
			nodes: []*Node{with(h200("n1", all1g, all1g), func(n *Node) {
				n.Applied = "all-1g.18gb"
				n.InUse = []InUse{{GPU: 0, Start: 3, Profile: "1g.18gb", Pod: "ml/r0"}, {GPU: 1, Start: 6, Profile: "1g.18gb", Pod: "ml/r1"}}
			})},
			unserv: map[string]string{"ml/a": WhyWouldEvict}},
		{name: "a pod on the node the trail does not locate blocks every change", pods: []Pod{pod("a", want3g, 0)},
			nodes:  []*Node{with(h200("n1", "", ""), func(n *Node) { n.Unlocated = []string{"ml/whole-gpu"} })},
			unserv: map[string]string{"ml/a": WhyWouldEvict}},
		{name: "profile unknown to every allowed config", nodes: []*Node{h200("n1", "", "")},
			pods:   []Pod{pod("a", map[string]int{"7g.141gb": 1}, 0)},
			unserv: map[string]string{"ml/a": WhyUnknownProfile}},
		{name: "more than any config gives", nodes: []*Node{h200("n1", "", "")},
			pods:   []Pod{pod("a", map[string]int{"3g.71gb": 5}, 0)},
			unserv: map[string]string{"ml/a": WhyTooLarge}},
		{name: "ties: node name", nodes: []*Node{h200("n2", "", ""), h200("n1", "", "")}, pods: []Pod{pod("a", want3g, 0)},
			decisions: []string{"n1=first-3g gpus=[0] pods=[ml/a]"}},
		{name: "max-concurrent: a node in flight uses the only slot", pods: []Pod{pod("a", want3g, 0)},
			nodes:   []*Node{with(h200("n0", "", ""), func(n *Node) { n.InFlight = true }), h200("n1", "", "")},
			opts:    Options{MaxConcurrent: 1},
			waiting: []string{"ml/a"}},
		{name: "max-concurrent 2: two nodes for two pods that one node cannot serve", pods: []Pod{pod("a", map[string]int{"3g.71gb": 4}, 0), pod("b", map[string]int{"3g.71gb": 4}, 1)},
			nodes:     []*Node{h200("n1", "", ""), h200("n2", "", "")},
			opts:      Options{MaxConcurrent: 2},
			decisions: []string{"n1=all-3g.71gb gpus=[0 1] pods=[ml/a]", "n2=all-3g.71gb gpus=[0 1] pods=[ml/b]"}},
		{name: "hold time: a node changed a moment ago and busy is not changed again", pods: []Pod{pod("a", map[string]int{"3g.71gb": 3}, 0)},
			nodes: []*Node{with(h200("n1", "3g.71gb@0 3g.71gb@4", ""), func(n *Node) {
				n.Applied, n.PlannedAt = "first-3g", now.Add(-time.Minute)
				n.InUse = []InUse{{GPU: 0, Start: 0, Profile: "3g.71gb", Pod: "ml/run"}}
			})},
			opts:    Options{HoldTime: 10 * time.Minute},
			waiting: []string{"ml/a"}},
		{name: "after the hold time the busy node may change (what is in use stays)", pods: []Pod{pod("a", map[string]int{"3g.71gb": 3}, 0)},
			nodes: []*Node{with(h200("n1", "3g.71gb@0 3g.71gb@4", ""), func(n *Node) {
				n.Applied, n.PlannedAt = "first-3g", now.Add(-time.Hour)
				n.InUse = []InUse{{GPU: 0, Start: 0, Profile: "3g.71gb", Pod: "ml/run"}}
			})},
			opts:      Options{HoldTime: 10 * time.Minute},
			decisions: []string{"n1=all-3g.71gb gpus=[1] pods=[ml/a]"}},
		{name: "hold time: an idle node is held too (deleting the pod frees nothing early)", pods: []Pod{pod("a", map[string]int{"1g.18gb": 1}, 0)},
			nodes: []*Node{with(h200("n1", "3g.71gb@0 3g.71gb@4", ""), func(n *Node) {
				n.Applied, n.PlannedAt = "first-3g", now.Add(-time.Minute)
			})},
			opts:    Options{HoldTime: 10 * time.Minute},
			waiting: []string{"ml/a"}},
		{name: "after the hold time an idle node may change again", pods: []Pod{pod("a", map[string]int{"1g.18gb": 1}, 0)},
			nodes: []*Node{with(h200("n1", "3g.71gb@0 3g.71gb@4", ""), func(n *Node) {
				n.Applied, n.PlannedAt = "first-3g", now.Add(-11*time.Minute)
			})},
			opts:      Options{HoldTime: 10 * time.Minute},
			decisions: []string{"n1=all-1g.18gb gpus=[0 1] pods=[ml/a]"}},
		{name: "a node with planned pods waiting for it is not idle", pods: []Pod{pod("a", map[string]int{"1g.18gb": 1}, 0)},
			nodes: []*Node{with(h200("n1", "3g.71gb@0 3g.71gb@4", ""), func(n *Node) {
				n.Applied, n.PlannedAt, n.Reserved = "first-3g", now.Add(-time.Minute), 1
			})},
			opts:    Options{HoldTime: 10 * time.Minute},
			waiting: []string{"ml/a"}},
		{name: "a node already offers it: no change", pods: []Pod{pod("a", want3g, 0)},
			nodes:   []*Node{with(h200("n1", "3g.71gb@0 3g.71gb@4", ""), func(n *Node) { n.Applied = "first-3g" })},
			waiting: []string{"ml/a"}},
		{name: "a node whose geometry is unknown is left alone", pods: []Pod{pod("a", want3g, 0)},
			nodes:  []*Node{with(h200("n1", "", ""), func(n *Node) { n.Unreadable = "no model" })},
			unserv: map[string]string{"ml/a": WhyUnknownProfile}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.Allowed = allowed
			out := Decide(spec, tc.nodes, tc.pods, now, o)
			var got []string
			for _, d := range out.Decisions {
				var ps []string
				for _, p := range d.Pods {
					ps = append(ps, p.Key())
				}
				got = append(got, fmt.Sprintf("%s=%s gpus=%v pods=%v", d.Node, d.Config, d.GPUs, ps))
			}
			if !slices.Equal(got, tc.decisions) {
				t.Errorf("decisions = %q, want %q (notes %q)", got, tc.decisions, out.Notes)
			}
			if len(out.Unservable) != len(tc.unserv) {
				t.Errorf("unservable = %q, want %q", out.Unservable, tc.unserv)
			}
			for k, why := range tc.unserv {
				if !strings.HasPrefix(out.Unservable[k], why) {
					t.Errorf("unservable[%s] = %q, want it to start with %q", k, out.Unservable[k], why)
				}
			}
			for _, k := range tc.waiting {
				if _, ok := out.Waiting[k]; !ok {
					t.Errorf("%s not waiting: %q", k, out.Waiting)
				}
			}
		})
	}
}

// The decision is stable: the same inputs in another order give the same
// outcome.
func TestDecideStable(t *testing.T) {
	spec := testSpec(t)
	o := Options{Allowed: []string{"second-3g", "first-3g", "all-3g.71gb"}, MaxConcurrent: 1}
	pods := []Pod{pod("b", map[string]int{"3g.71gb": 1}, 1), pod("a", map[string]int{"3g.71gb": 1}, 1)}
	a := Decide(spec, []*Node{h200("x", "", ""), h200("y", "", "")}, pods, time.Unix(0, 0), o)
	slices.Reverse(pods)
	b := Decide(spec, []*Node{h200("y", "", ""), h200("x", "", "")}, pods, time.Unix(0, 0), o)
	if len(a.Decisions) != 1 || len(b.Decisions) != 1 || a.Decisions[0].Node != b.Decisions[0].Node || a.Decisions[0].Config != b.Decisions[0].Config {
		t.Fatalf("%+v vs %+v", a.Decisions, b.Decisions)
	}
	if d := a.Decisions[0]; d.Node != "x" || d.Config != "first-3g" {
		t.Errorf("decision %s=%s, want x=first-3g (GPU 0 before GPU 1: config name)", d.Node, d.Config)
	}
}

func TestParseInstance(t *testing.T) {
	for in, want := range map[string]string{
		"3g.71gb@4":               "3g.71gb@4 []",
		"1c.3g.71gb@0":            "3g.71gb@0 [1c.3g.71gb]",
		"2c.3g.71gb+1c.3g.71gb@4": "3g.71gb@4 [2c.3g.71gb 1c.3g.71gb]",
		"3×1c.3g.71gb@0":          "3g.71gb@0 [1c.3g.71gb 1c.3g.71gb 1c.3g.71gb]",
		"3g.71gb[none]@0":         "3g.71gb@0 []",
	} {
		got, err := ParseInstance(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if s := fmt.Sprintf("%s@%d %v", got.Profile, got.Start, got.Compute); s != want {
			t.Errorf("%s: %s, want %s", in, s, want)
		}
		if got.Name() != strings.Split(in, "@")[0] {
			t.Errorf("%s: Name() = %s", in, got.Name())
		}
	}
	for _, bad := range []string{"3g.71gb", "3g.71gb@x", "x×1c.3g.71gb@0", "1c.3g.71gb+1c.2g.35gb@0"} {
		if _, err := ParseInstance(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// NodeGPUs reads GPU Feature Discovery's labels and the record's geometry.
func TestNodeGPUs(t *testing.T) {
	spec := testSpec(t)
	st := published.Node{Geometry: []record.GPUGeometry{{Index: 0, Instances: []string{"3g.71gb@0", "3g.71gb@4"}}, {Index: 1, Instances: []string{}}},
		Applied: "first-3g"}
	gpus, err := NodeGPUs(map[string]string{LabelGPUProduct: "NVIDIA-H200"}, st, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 || !gpus[0].ModeCurrent || gpus[1].ModeCurrent || len(gpus[0].Instances) != 2 {
		t.Fatalf("gpus = %+v", gpus)
	}
	if _, err := NodeGPUs(map[string]string{LabelGPUProduct: "NVIDIA-H200", LabelGPUCount: "4"}, published.Node{}, spec); err != nil {
		t.Errorf("count from the label: %v", err)
	}
	if _, err := NodeGPUs(map[string]string{LabelGPUProduct: "Tesla-T4", LabelGPUCount: "1"}, published.Node{}, spec); err == nil {
		t.Error("an unknown model is no error")
	}
	if _, err := NodeGPUs(map[string]string{LabelGPUProduct: "NVIDIA-H200"}, published.Node{}, spec); err == nil {
		t.Error("no GPU count is no error")
	}
}
