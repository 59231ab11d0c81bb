package e2e

// A light Node: the agent keeps each change record whole in the ConfigMap
// <node>-mig-history (owned by the Node, written only by the node's agent
// under the shipped policy mig-agent-history) and a light form of it on
// the Node (the evicted pods counted, the first named, a pointer to the
// whole record), with the condition MIGConfigReady in the Node's status.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/published/status"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// lnCondition is the Node's MIGConfigReady condition (nil: none).
func lnCondition(n *corev1.Node) *corev1.NodeCondition {
	for i, c := range n.Status.Conditions {
		if c.Type == record.ConditionConfigReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// 40 pods on GPU 0 evicted by one change: the Node's last change names
// those that fit its bound and counts them all, its history entry names
// none, both point to the ConfigMap, which names all 40; the condition is
// True after the success, False with the config and the reason after a
// failure; `mig-agent status` shows the whole records.
func TestLightNodeHistory(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node, kl, ns := kubeletNode(t)
	o := (&Opts{Node: node, Sim: "h200x8"}).Fill(t)
	gpus := disProfiles(t, o.Sim, o.SimState)
	var want []string
	for r := range 40 {
		p := kl.RunPod(t, ns, fmt.Sprintf("llama-finetune-worker-7d9f8b6c5-%02d", r), map[string]string{"nvidia.com/gpu": "1"},
			map[string][]string{"nvidia.com/gpu": {fmt.Sprintf("%s::%d", gpus[0].UUID, r)}}, disOwner("train"))
		want = append(want, ns+"/"+p.Name)
	}
	o.Extra = []string{"--pod-resources-socket", kl.Socket()}
	StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", changeTimeout)
	n := GetNode(t, c, node)
	ref := record.FullRecordRef(o.Namespace, node)

	last := LastChange(t, n)
	if last.EvictedPodCount != 40 || len(last.EvictedPods) == 0 || len(last.EvictedPods) >= 40 ||
		len(last.EvictedPods)+last.EvictedPodsOmitted != 40 || last.FullRecord != ref {
		t.Errorf("last change on the Node: %d named, %d omitted, evictedPodCount %d, fullRecord %q",
			len(last.EvictedPods), last.EvictedPodsOmitted, last.EvictedPodCount, last.FullRecord)
	}
	if raw := n.Annotations[record.AnnotationLastChange]; len(raw) > 4<<10 {
		t.Errorf("the last change takes %d bytes on the Node", len(raw))
	}
	hist := NodeHistory(t, n)
	if len(hist) != 1 || hist[0].EvictedPodCount != 40 || len(hist[0].EvictedPods) != 0 || hist[0].EvictedPodsOmitted != 40 || hist[0].Geometry != nil ||
		hist[0].FullRecord != ref || hist[0].RequestedBy == "" || hist[0].ConfigHash != last.ConfigHash {
		t.Errorf("history entry on the Node: %+v", hist)
	}

	// Light: what the change was, how it ended and who asked; the rest
	// only in the whole record.
	var rawHist []map[string]any
	if err := json.Unmarshal([]byte(n.Annotations[record.AnnotationHistory]), &rawHist); err != nil || len(rawHist) != 1 {
		t.Fatalf("history annotation: %v", err)
	}
	for _, k := range []string{"config", "previousConfig", "result", "startedAt", "finishedAt", "gpusChanged", "gpusUntouched",
		"evictedPods", "evictedPodCount", "reboot", "configHash", "requestedBy", "requestedAt", "fullRecord"} {
		if _, ok := rawHist[0][k]; !ok {
			t.Errorf("the history entry on the Node has no %q", k)
		}
	}
	for _, k := range []string{"geometry", "agentVersion", "driverVersion", "configSource", "disruptedAt"} {
		if _, ok := rawHist[0][k]; ok {
			t.Errorf("the light history entry on the Node has %q", k)
		}
	}
	if _, ok := rawHist[0]["evictedPods"].([]any); !ok {
		t.Errorf("evictedPods of the history entry is %v, want an array", rawHist[0]["evictedPods"])
	}
	cm, err := c.CoreV1().ConfigMaps(o.Namespace).Get(ctx, record.HistoryConfigMapName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the history ConfigMap: %v", err)
	}
	if cm.Labels[record.LabelManagedBy] != "mig-agent" || cm.Labels[record.LabelNode] != node ||
		len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Kind != "Node" || cm.OwnerReferences[0].UID != n.UID {
		t.Errorf("history ConfigMap metadata: labels %v owners %+v", cm.Labels, cm.OwnerReferences)
	}
	var whole []record.ChangeRecord
	if err := json.Unmarshal([]byte(cm.Data[record.HistoryConfigMapKey]), &whole); err != nil || len(whole) != 1 {
		t.Fatalf("history ConfigMap: %d records, %v", len(whole), err)
	}
	if got := slices.Sorted(slices.Values(whole[0].EvictedPods)); !slices.Equal(got, want) || whole[0].Geometry == nil || whole[0].FullRecord != "" {
		t.Errorf("the whole record: %d pods named, geometry %v", len(got), whole[0].Geometry != nil)
	}
	cond := lnCondition(n)
	if cond == nil || cond.Status != corev1.ConditionTrue || cond.Reason != record.ConditionReasonSuccess || !strings.Contains(cond.Message, `"all-1g.18gb"`) {
		t.Errorf("condition after success: %+v", cond)
	}

	out, _, code := RunCLI(t, "status", "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace, "--node", node, "-o", "json")
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status (exit %d): %v\n%s", code, err, out)
	}
	if st.HistoryFrom != ref || st.LastChange == nil || len(st.LastChange.EvictedPods) != 40 || len(st.History) != 1 || len(st.History[0].EvictedPods) != 40 {
		t.Errorf("status: historyFrom %q, last change %+v", st.HistoryFrom, st.LastChange)
	}

	// A config that does not exist: failed at once; the condition says so.
	SelectConfig(t, c, node, "no-such-config")
	rec := WaitState(t, c, node, record.StateFailed, "no-such-config", changeTimeout)
	n = GetNode(t, c, node)
	cond = lnCondition(n)
	if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != record.ConditionReasonFailed ||
		!strings.Contains(cond.Message, `"no-such-config"`) || !strings.Contains(cond.Message, record.Truncate(rec.Reason, 40)[:30]) {
		t.Errorf("condition after a failure: %+v (reason %q)", cond, rec.Reason)
	}
	if h := History(t, n); len(h) != 2 || h[0].Config != "no-such-config" || h[1].Config != "all-1g.18gb" {
		t.Errorf("history on the Node: %+v", h)
	}
	t.Logf("SCENARIO 40 pods evicted then a failure: the records add %d bytes to the Node; the ConfigMap holds %d",
		kube.Footprint(n), len(cm.Data[record.HistoryConfigMapKey]))
}

// Under the shipped policies, only the agent of node A (its
// ServiceAccount, with a token bound to a pod on A) writes A's history
// ConfigMap: not for node B, not cluster-admin (neither an update nor a
// delete); outside the agent's namespace the policy does not apply.
func TestLightNodeHistoryPolicy(t *testing.T) {
	admin := kubetest.Client(t)
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)
	policy := pkgNamed(t, in.objs, "ValidatingAdmissionPolicy", "-history").GetName()
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	kubetest.CreateNode(t, nodeA, nil)
	kubetest.CreateNode(t, nodeB, nil)
	agentA := pkgTokenClient(t, pkgBoundToken(t, in, nodeA))
	cm := func(node string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.HistoryConfigMapName(node), Namespace: in.namespace},
			Data: map[string]string{record.HistoryConfigMapKey: `[{"config":"all-balanced","result":"success","requestedBy":"alice"}]`}}
	}
	ctx := context.Background()
	t.Cleanup(func() {
		_ = agentA.CoreV1().ConfigMaps(in.namespace).Delete(context.Background(), record.HistoryConfigMapName(nodeA), metav1.DeleteOptions{})
	})
	WaitFor(t, policyTimeout, "the policy "+policy+" to refuse cluster-admin", func() bool {
		_, err := admin.CoreV1().ConfigMaps(in.namespace).Create(ctx, cm(nodeA), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return deniedBy(err, policy, "may not")
	})
	if _, err := agentA.CoreV1().ConfigMaps(in.namespace).Create(ctx, cm(nodeA), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the agent of %s cannot write its own history: %v", nodeA, err)
	}
	got, err := agentA.CoreV1().ConfigMaps(in.namespace).Get(ctx, record.HistoryConfigMapName(nodeA), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Data[record.HistoryConfigMapKey] = `[]`
	if _, err := agentA.CoreV1().ConfigMaps(in.namespace).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the agent of %s cannot update its own history: %v", nodeA, err)
	}
	if _, err := agentA.CoreV1().ConfigMaps(in.namespace).Create(ctx, cm(nodeB), metav1.CreateOptions{}); !deniedBy(err, policy, "only the mig-agent of node "+nodeB) {
		t.Errorf("the agent of %s wrote %s's history: %v", nodeA, nodeB, err)
	}
	got, err = admin.CoreV1().ConfigMaps(in.namespace).Get(ctx, record.HistoryConfigMapName(nodeA), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Data[record.HistoryConfigMapKey] = `[{"config":"forged","result":"success","requestedBy":"mallory"}]`
	if _, err := admin.CoreV1().ConfigMaps(in.namespace).Update(ctx, got, metav1.UpdateOptions{}); !deniedBy(err, policy, "may not") {
		t.Errorf("cluster-admin rewrote the history: %v", err)
	}
	if err := admin.CoreV1().ConfigMaps(in.namespace).Delete(ctx, got.Name, metav1.DeleteOptions{}); !deniedBy(err, policy, "may not") {
		t.Errorf("cluster-admin deleted the history: %v", err)
	}
	other := kubetest.NewName(t, "elsewhere")
	kubetest.CreateNamespace(t, other)
	if _, err := admin.CoreV1().ConfigMaps(other).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: record.HistoryConfigMapName(nodeA), Namespace: other}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("outside the agent's namespace the policy refused: %v", err)
	}
}
