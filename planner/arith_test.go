package planner

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/geometry"
)

func limits(l map[string]string) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{Limits: corev1.ResourceList{}}
	for k, v := range l {
		r.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return r
}

// Wants are bounded: two containers at 2^63-1 each do not wrap to a
// negative want; such a pod is unservable, said so, and a younger pod of
// the profile is still planned for.
func TestWantsCannotOverflow(t *testing.T) {
	huge := fmt.Sprint(int64(math.MaxInt64))
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Resources: limits(map[string]string{"nvidia.com/mig-3g.71gb": huge})},
		{Name: "b", Resources: limits(map[string]string{"nvidia.com/mig-3g.71gb": huge})},
	}}}
	w := MigWants(p)
	if w["3g.71gb"] != MaxWant {
		t.Fatalf("MigWants = %v, want 3g.71gb at MaxWant", w)
	}
	if w := MigWants(&corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: limits(map[string]string{"nvidia.com/mig-1g.18gb": "1e30"})}}}}); w["1g.18gb"] != MaxWant {
		t.Errorf("MigWants(1e30) = %v", w)
	}
	big := pod("big", w, 0)
	small := pod("small", map[string]int{"3g.71gb": 1}, 1)
	out := Decide(testSpec(t), []*Node{h200("n1", "", "")}, []Pod{big, small}, time.Unix(0, 0),
		Options{Allowed: []string{"all-1g.18gb", "all-3g.71gb", "first-3g"}, MaxConcurrent: 1})
	if len(out.Decisions) != 1 || out.Decisions[0].Pods[0].Name != "small" {
		t.Errorf("decisions %+v: want one change for the small pod", out.Decisions)
	}
	if why := out.Unservable["ml/big"]; !strings.HasPrefix(why, WhyTooLarge) {
		t.Errorf("unservable[big] = %q, want %q", why, WhyTooLarge)
	}
	// Init containers: the largest counts, bounded too; zero asks nothing.
	p.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: limits(map[string]string{"nvidia.com/mig-2g.35gb": "0"})}}
	if _, ok := MigWants(p)["2g.35gb"]; ok {
		t.Errorf("an init container's 0 counts: %v", MigWants(p))
	}
}

// A free device serves one pending pod, once: three pods beside one free
// 1g device, and an idle opted-in node: one waits for the device, the
// idle node is reshaped for the other two.
func TestFreeDeviceServesOnce(t *testing.T) {
	a := with(h200("a", all1g), func(n *Node) {
		n.Applied = "all-1g.18gb"
		for s := range 6 { // one device free
			n.InUse = append(n.InUse, InUse{GPU: 0, Start: s, Profile: "1g.18gb", Pod: fmt.Sprintf("ml/r%d", s)})
		}
	})
	b := h200("b", "")
	w := map[string]int{"1g.18gb": 1}
	pods := []Pod{pod("p1", w, 0), pod("p2", w, 1), pod("p3", w, 2)}
	out := Decide(testSpec(t), []*Node{a, b}, pods, time.Unix(0, 0), Options{Allowed: []string{"all-1g.18gb"}, MaxConcurrent: 1})
	if len(out.Decisions) != 1 || out.Decisions[0].Node != "b" || len(out.Decisions[0].Pods) != 2 {
		t.Fatalf("decisions %+v, want b reshaped for two pods (waiting %v)", out.Decisions, out.Waiting)
	}
	if _, ok := out.Waiting["ml/p1"]; !ok {
		t.Errorf("p1 does not wait for the free device: %v", out.Waiting)
	}
}

// A pod counts only for the nodes it can be scheduled on: a node selector
// no opted-in node matches, or a taint it does not tolerate, makes it
// unservable there, and no node is reshaped for it.
func TestDemandThatCanLand(t *testing.T) {
	w := map[string]int{"3g.71gb": 1}
	kn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "a"}}}
	n := with(h200("n1", "", ""), func(n *Node) { n.obj = kn })
	o := Options{Allowed: []string{"first-3g"}, MaxConcurrent: 1}
	mk := func(spec corev1.PodSpec) Pod {
		p := pod("p", w, 0)
		p.lands = landsOn(&corev1.Pod{Spec: spec})
		return p
	}
	if out := Decide(testSpec(t), []*Node{n}, []Pod{mk(corev1.PodSpec{NodeSelector: map[string]string{"pool": "b"}})}, time.Unix(0, 0), o); len(out.Decisions) != 0 ||
		!strings.HasPrefix(out.Unservable["ml/p"], WhyNoFit) {
		t.Errorf("nodeSelector pool=b: %+v, unservable %q", out.Decisions, out.Unservable)
	}
	if out := Decide(testSpec(t), []*Node{n}, []Pod{mk(corev1.PodSpec{NodeSelector: map[string]string{"pool": "a"}})}, time.Unix(0, 0), o); len(out.Decisions) != 1 {
		t.Errorf("nodeSelector pool=a: no change (%q)", out.Unservable)
	}
	kn.Spec.Taints = []corev1.Taint{{Key: "team", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
	if out := Decide(testSpec(t), []*Node{n}, []Pod{mk(corev1.PodSpec{})}, time.Unix(0, 0), o); len(out.Decisions) != 0 {
		t.Errorf("untolerated taint: a change %+v", out.Decisions)
	}
	tol := corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "x", Effect: corev1.TaintEffectNoSchedule}}}
	if out := Decide(testSpec(t), []*Node{n}, []Pod{mk(tol)}, time.Unix(0, 0), o); len(out.Decisions) != 1 {
		t.Errorf("tolerated taint: no change (%q)", out.Unservable)
	}
	aff := corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a"}}}}}}}},
		Tolerations: tol.Tolerations}
	if out := Decide(testSpec(t), []*Node{n}, []Pod{mk(aff)}, time.Unix(0, 0), o); len(out.Decisions) != 0 {
		t.Errorf("node affinity pool notin (a): a change %+v", out.Decisions)
	}
}

// Only GPU resources make a running pod a GPU user: NVIDIA's NIC
// resources do not (the agent's rule).
func TestOnlyGPUResourcesCount(t *testing.T) {
	nic := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: limits(map[string]string{"nvidia.com/hostdev": "1", "nvidia.com/rdma_shared_device_a": "1"})}}}}
	if usesGPU(nic) {
		t.Error("a NIC pod is taken for a GPU user")
	}
	gpu := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: limits(map[string]string{"nvidia.com/gpu": "1"})}}}}
	if !usesGPU(gpu) {
		t.Error("a GPU pod is not taken for a GPU user")
	}
}

// 1,500 pending pods and 20 nodes: a round stays well under a second.
func TestDecideScales(t *testing.T) {
	nodes, pods := scaleInputs(20, 1500)
	start := time.Now()
	out := Decide(testSpec(t), nodes, pods, time.Unix(0, 0), Options{Allowed: []string{"all-1g.18gb", "all-3g.71gb", "first-3g", "second-3g"}, MaxConcurrent: 1})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a round of 1,500 pods took %s", d)
	}
	if len(out.Decisions) != 1 {
		t.Errorf("%d decisions", len(out.Decisions))
	}
}

func BenchmarkDecide1500(b *testing.B) {
	nodes, pods := scaleInputs(20, 1500)
	spec, _ := testSpecB()
	o := Options{Allowed: []string{"all-1g.18gb", "all-3g.71gb", "first-3g", "second-3g"}, MaxConcurrent: 1}
	for b.Loop() {
		Decide(spec, nodes, pods, time.Unix(0, 0), o)
	}
}

func scaleInputs(nn, np int) ([]*Node, []Pod) {
	var nodes []*Node
	for i := range nn {
		nodes = append(nodes, with(h200(fmt.Sprintf("n%02d", i), all1g, ""), func(n *Node) { n.Applied = "x" }))
	}
	var pods []Pod
	for i := range np {
		prof := "1g.18gb"
		if i%2 == 1 {
			prof = "3g.71gb"
		}
		pods = append(pods, pod(fmt.Sprintf("p%04d", i), map[string]int{prof: 1}, i))
	}
	return nodes, pods
}

func testSpecB() (*geometry.Spec, error) { return geometry.Parse([]byte(testConfig)) }

// A node whose agent does not act on its label within ActTimeout is
// silent: it stops counting against MaxConcurrent (another node is
// changed) and is not planned for itself.
func TestSilentNodeFreesItsSlot(t *testing.T) {
	now := time.Unix(10000, 0)
	o := Options{Allowed: []string{"first-3g"}, MaxConcurrent: 1, ActTimeout: 5 * time.Minute}
	silent := with(h200("a", "", ""), func(n *Node) { n.InFlight, n.Desired, n.LabelAt = true, "first-3g", now.Add(-6*time.Minute) })
	acting := with(h200("b", "", ""), func(n *Node) { n.InFlight, n.Changing, n.LabelAt = true, true, now.Add(-time.Hour) })
	fresh := with(h200("c", "", ""), func(n *Node) { n.InFlight, n.LabelAt = true, now.Add(-time.Minute) })
	got := Silence([]*Node{silent, acting, fresh}, now, o)
	if len(got) != 1 || got[0] != silent || !silent.Silent || acting.Silent || fresh.Silent {
		t.Fatalf("Silence = %v", got)
	}
	idle := h200("d", "", "")
	out := Decide(testSpec(t), []*Node{silent, idle}, []Pod{pod("p", map[string]int{"3g.71gb": 1}, 0)}, now, o)
	if len(out.Decisions) != 1 || out.Decisions[0].Node != "d" {
		t.Errorf("decisions %+v, want d changed (the silent node holds no slot, and is not chosen)", out.Decisions)
	}
}
