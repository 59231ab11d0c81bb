package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// The planner plans from the node's own truth and watches pods: on nodes
// WITHOUT GPU Feature Discovery's labels, a pending pod asking for
// nvidia.com/mig-3g.71gb gets the idle opted-in node reshaped, the label
// set within 2.5 s of the pod becoming unschedulable (its PodScheduled=False
// condition's lastTransitionTime), with the planner's default interval
// (5 s), and is bound there by the real scheduler. The node's GPUs, their
// profiles and placements are read from what its agent published
// (ConfigMap <node>-mig-config, annotation migagent.io/gpus). (On b20dfeb the planner
// needed nvidia.com/gpu.product and said "no allowed config offers the
// profile"; and it polled every 5 s.)
func TestPlannerPlansFromAgentsTruth(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(plannerConfigs), 0o600); err != nil {
		t.Fatal(err)
	}
	node := kubetest.NewName(t, "bare")
	kubetest.CreateNode(t, node, map[string]string{"migagent.io/planner": "enabled"}) // no GFD label at all
	reportCapacity(t, c, node)
	ops, work := kubetest.NewName(t, "gpu-operator"), kubetest.NewName(t, "work")
	kubetest.CreateNamespace(t, ops)
	kubetest.CreateNamespace(t, work)
	o := (&Opts{Node: node, Sim: "h200x1"}).Fill(t)
	o.Extra = append(o.Extra, "-f", cfg, "--assignment-interval", "0", "--operand-namespace", ops)
	dp := kubetest.StartDevicePlugin(t, c, node, ops, "mixed", pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run", dp.Counted)
	StartAgent(t, o)
	var doc geometry.Published
	WaitFor(t, 30*time.Second, "the agent's published GPUs", func() bool {
		cm, err := c.CoreV1().ConfigMaps(o.Namespace).Get(ctx, node+"-mig-config", metav1.GetOptions{})
		return err == nil && json.Unmarshal([]byte(cm.Annotations[record.AnnotationGPUs]), &doc) == nil && len(doc.GPUs) == 1
	})
	if g := doc.GPUs[0]; g.Name != "NVIDIA H200" || g.PCIDeviceID != "0x233510DE" || g.Catalogue == nil || len(g.Catalogue.Profiles) == 0 {
		t.Fatalf("published GPU: %+v", g)
	}
	kubetest.StartScheduler(t)
	port := freePort(t)
	planner := startProcess(t, []string{"planner", "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace, "-f", cfg,
		"--allowed-configs", "all-1g.18gb,all-3g.71gb", "--max-concurrent", "1", "--lease-duration", "15s",
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port)}, fmt.Sprintf("http://127.0.0.1:%d", port))
	WaitFor(t, 30*time.Second, "the planner to lead", func() bool {
		resp, err := http.Get(planner.Metrics + "/metrics") //nolint:noctx // loopback
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), "migagent_planner_leader 1\n")
	})

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: work, Name: "big"},
		Spec: corev1.PodSpec{SchedulerName: kubetest.SchedulerName, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{migContainer(kubetest.PodContainer, "3g.71gb", "1")}}}
	if _, err := c.CoreV1().Pods(work).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var labelAt time.Time
	WaitFor(t, 20*time.Second, "the planner's label on "+node, func() bool {
		if GetNode(t, c, node).Labels[record.LabelConfig] == "" {
			return false
		}
		labelAt = time.Now()
		return true
	})
	p, err := c.CoreV1().Pods(work).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var since time.Time
	for _, cd := range p.Status.Conditions {
		if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse {
			since = cd.LastTransitionTime.Time
		}
	}
	if since.IsZero() {
		t.Fatalf("the pod was never marked unschedulable: %+v", p.Status.Conditions)
	}
	lat := labelAt.Sub(since)
	t.Logf("label %s set %s after the pod became unschedulable (lastTransitionTime %s, second-granular)",
		GetNode(t, c, node).Labels[record.LabelConfig], lat.Round(time.Millisecond), since.Format(time.RFC3339))
	if lat > 2500*time.Millisecond {
		t.Errorf("the label came %s after the pod became unschedulable, want at most 2.5 s", lat)
	}
	WaitFor(t, 90*time.Second, "pod big bound", func() bool {
		got, err := c.CoreV1().Pods(work).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && got.Spec.NodeName == node
	})
}
