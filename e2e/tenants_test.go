package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// A tenant who may create pods (and PodDisruptionBudgets) in its own
// namespace labels a CPU pod on a GPU node as NVIDIA's device plugin and
// guards it with a budget that allows no disruption. The agent takes no
// such pod for an operand: it is not a DaemonSet's, and not in an operand
// namespace. The change succeeds at once, the pod is left running, and the
// log names it. (On b20dfeb the agent "restarted" it, took the budget's
// 429 for an API outage and retried for two minutes with the node tainted
// and pending, then failed: on every change of the node.)
func TestTenantPodIsNoOperand(t *testing.T) {
	c := kubetest.Client(t)
	node, kl, tenant := kubeletNode(t)
	poser := kl.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "nvidia-device-plugin-daemonset-x1",
			Labels: map[string]string{"app": "nvidia-device-plugin-daemonset"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "busybox"}}},
	})
	disCreatePDB(t, c, tenant, "nvidia-device-plugin-daemonset", 0)
	o := (&Opts{Node: node, Sim: "h200x2", Extra: []string{"--pod-resources-socket", kl.Socket(), "--max-concurrent", "1"}}).Fill(t)
	a := StartAgent(t, o)
	start := time.Now()
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 45*time.Second)
	t.Logf("success after %s", time.Since(start).Round(time.Millisecond))
	got, err := c.CoreV1().Pods(tenant).Get(context.Background(), poser.Name, metav1.GetOptions{})
	if err != nil || got.UID != poser.UID || got.DeletionTimestamp != nil {
		t.Errorf("the tenant's pod was touched: %v", err)
	}
	want := tenant + "/" + poser.Name + " (selected as device-plugin; namespace " + tenant + " is not an operand namespace"
	WaitFor(t, 5*time.Second, "a warning naming the tenant's pod", func() bool { return strings.Contains(a.Log(), want) })
}

// A PodDisruptionBudget that refuses the restart of a true operand (the
// device plugin's DaemonSet pod in the operand namespace) is no API
// outage: the change fails at once with that reason, the taint and the
// rollout slot are released, and the retry waits its backoff. (On b20dfeb
// the 429 was retried as an outage for two minutes, tainted, pending, the
// slot held.)
func TestOperandBudgetFailsAtOnce(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
	ops := kubetest.NewName(t, "gpu-operator")
	kubetest.CreateNamespace(t, ops)
	agents := kubetest.NewName(t, "agents")
	kubetest.CreateNamespace(t, agents)
	o := (&Opts{Node: node, Sim: "h200x2", Namespace: agents, Extra: []string{"--operand-namespace", ops, "--max-concurrent", "1",
		"--retry-backoff-max", "10m"}}).Fill(t)
	dp := kubetest.StartDevicePlugin(t, c, node, ops, "mixed", pluginReader(t, o))
	WaitFor(t, 60*time.Second, "the device plugin pod to run, counted by its DaemonSet", dp.Counted)
	WaitFor(t, 30*time.Second, "the Node's allocatable to show the whole GPUs", func() bool {
		return sameCounts(allocatable(t, c, node), map[string]int64{"nvidia.com/gpu": 2})
	})
	disCreatePDB(t, c, ops, kubetest.DevicePluginApp, 0)
	StartAgent(t, o)
	start := time.Now()
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", 40*time.Second)
	t.Logf("failed after %s: %s", time.Since(start).Round(time.Millisecond), rec.Reason)
	if !strings.Contains(rec.Reason, drain.ErrOperandBudget.Error()) || !strings.Contains(rec.Reason, ops+"/") {
		t.Errorf("reason %q does not say a PodDisruptionBudget refused the operand's restart", rec.Reason)
	}
	if disTainted(GetNode(t, c, node)) {
		t.Errorf("node left tainted")
	}
	WaitFor(t, 10*time.Second, "the rollout slot to be free", func() bool {
		held, err := ccHolders(context.Background(), c, agents)
		return err == nil && len(held) == 0
	})
	// The retry waits its backoff: no second attempt within a few seconds.
	time.Sleep(3 * time.Second)
	if n := len(History(t, GetNode(t, c, node))); n != 1 {
		t.Errorf("%d records within 3 s of the failure, want 1 (the retry waits its backoff)", n)
	}
}
