package planner

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/record"
)

// publishedCM is the ConfigMap an agent writes for node: its GPUs as read.
func publishedCM(t *testing.T, node string, gpus []geometry.GPU) *corev1.ConfigMap {
	t.Helper()
	doc, err := json.Marshal(geometry.Publish(gpus, nil, time.Unix(4000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "mig-agent", Name: node + "-mig-config",
		Annotations: map[string]string{record.AnnotationGPUs: string(doc)}},
		Data: map[string]string{record.ConfigMapKey: "version: v1\n"}}
}

// A node without GPU Feature Discovery's labels, of a model the built-in
// table lacks, is planned from what its agent published: its profiles and
// placements are the node's own.
func TestPlansFromWhatTheAgentPublished(t *testing.T) {
	h200, ok := profiles.ModelByKey("h200")
	if !ok {
		t.Fatal("no h200 in the table")
	}
	// A GPU the table does not know, offering the H200's profiles.
	gpu := geometry.GPU{Index: 0, UUID: "GPU-new", Name: "NVIDIA Future X", PCIDeviceID: 0x9999_10DE, Architecture: "blackwell",
		MigCapable: true, CanReset: true, Catalogue: h200.Catalogue}
	if _, known := profiles.ModelByPCIID(gpu.PCIDeviceID); known {
		t.Fatal("the model is in the table")
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{LabelOptIn: OptInValue}}}
	p, c, _ := newTestPlanner(t, false, node, publishedCM(t, "n1", []geometry.GPU{gpu, withIndex(gpu, 1)}), pendingPodObj("a", "3g.71gb"))
	out, err := p.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Decisions) != 1 || out.Decisions[0].Node != "n1" {
		t.Fatalf("decisions %+v, notes %v, unservable %v", out.Decisions, out.Notes, out.Unservable)
	}
	n, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if n.Labels[record.LabelConfig] == "" {
		t.Error("the label was not set")
	}
	// GFD's label, where it disagrees, only says so.
	nodes, err := Nodes(context.Background(), p.Client, p.Spec, "mig-agent")
	if err != nil || len(nodes) != 1 || nodes[0].Unreadable != "" || len(nodes[0].GPUs) != 2 || nodes[0].GPUs[0].Name != "NVIDIA Future X" {
		t.Fatalf("nodes %+v, err %v", nodes, err)
	}
	node.Labels[LabelGPUProduct] = "NVIDIA-H200"
	if _, err := c.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes, _ = Nodes(context.Background(), p.Client, p.Spec, "mig-agent")
	if nodes[0].Unreadable != "" || !strings.Contains(nodes[0].Note, "names none of the GPUs its agent reports") {
		t.Errorf("GFD disagreeing: unreadable %q, note %q", nodes[0].Unreadable, nodes[0].Note)
	}
}

func withIndex(g geometry.GPU, i int) geometry.GPU {
	g.Index = i
	return g
}

// The geometry is the newest of the published one and the agent's change
// record: a record newer than the publication wins, "mig-disabled"
// included.
func TestPublishedGeometryYieldsToNewerRecord(t *testing.T) {
	h200, _ := profiles.ModelByKey("h200")
	gpu := geometry.GPU{Index: 0, UUID: "GPU-0", Name: h200.Name, PCIDeviceID: h200.PCIDeviceID, Architecture: h200.Architecture,
		MigCapable: true, ModeCurrent: true, ModePending: true, CanReset: true, Catalogue: h200.Catalogue,
		Instances: []geometry.Instance{{Profile: "3g.71gb", Start: 0}, {Profile: "3g.71gb", Start: 4}}}
	data, _ := json.Marshal(geometry.Publish([]geometry.GPU{gpu}, nil, time.Unix(4000, 0)))
	_, gpus, err := geometry.ParsePublished(data)
	if err != nil || len(gpus[0].Instances) != 2 || gpus[0].Instances[1].Size != 4 || gpus[0].Instances[1].ProfileID == 0 {
		t.Fatalf("parsed %+v, %v", gpus, err)
	}
	if err := overlay(gpus, nil); err != nil || len(gpus[0].Instances) != 2 {
		t.Fatal("an empty overlay changed the geometry")
	}
	if err := overlay(gpus, []kubeGeo{{Index: 0, Instances: []string{"mig-disabled"}}}); err != nil || gpus[0].ModeCurrent || len(gpus[0].Instances) != 0 {
		t.Errorf("after mig-disabled: %+v, %v", gpus[0], err)
	}
	if err := overlay(gpus, []kubeGeo{{Index: 0, Instances: []string{"1g.18gb@0"}}}); err != nil || !gpus[0].ModeCurrent || len(gpus[0].Instances) != 1 {
		t.Errorf("after 1g.18gb@0: %+v, %v", gpus[0], err)
	}
	if err := overlay(gpus, []kubeGeo{{Index: 3}}); err == nil {
		t.Error("a record naming a GPU the node lacks was taken")
	}
}

type kubeGeo = record.GPUGeometry

// Run watches the unbound pods: a pod marked unschedulable is planned for
// at once, not at the next tick (an hour here).
func TestRunPlansAsPodBecomesUnschedulable(t *testing.T) {
	p, c, _ := newTestPlanner(t, false, optedIn("n1"))
	p.Clock, p.Interval = clock.RealClock{}, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(300 * time.Millisecond) // the first round, with nothing pending
	pod := pendingPodObj("a", "3g.71gb")
	pod.Status = corev1.PodStatus{}
	if _, err := c.CoreV1().Pods("ml").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	pod = pendingPodObj("a", "3g.71gb")
	start := time.Now()
	if _, err := c.CoreV1().Pods("ml").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		n, _ := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if n.Labels[record.LabelConfig] != "" {
			t.Logf("label set %s after the pod was marked unschedulable", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("no label 2 s after the pod was marked unschedulable")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A planner that may not watch pods (an older RBAC: get and list only)
// still plans: its rounds list the pods until a watch holds them.
func TestRunPlansWithoutWatch(t *testing.T) {
	p, c, _ := newTestPlanner(t, false, optedIn("n1"), pendingPodObj("a", "3g.71gb"))
	c.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no watch"))
	})
	p.Clock, p.Interval = clock.RealClock{}, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		n, _ := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if n.Labels[record.LabelConfig] != "" {
			return
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("no plan without a watch")
		}
	}
}
