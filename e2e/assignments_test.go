package e2e

// The assignment trail end to end: the real binary on the real API server,
// the test playing the kubelet (PodResources over gRPC). Pods start and stop
// on the MIG devices of an idle node; each gets its Event, the metric shows
// exactly the devices held, the history keeps the pods already gone with
// start and end, across a restart of the agent, and a pod name the kubelet
// reports as it is cannot forge an entry.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// trailEntry is one entry of `mig-agent assignments -o json` (the fields
// tests use).
type trailEntry struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	Container string `json:"container"`
	Device    struct {
		UUID      string `json:"uuid"`
		Profile   string `json:"profile"`
		GPU       int    `json:"gpu"`
		Placement string `json:"placement"`
	} `json:"device"`
	Change *struct {
		Config string `json:"config"`
		Hash   string `json:"hash"`
		Source string `json:"source"`
	} `json:"change"`
	DriverVersion string     `json:"driverVersion"`
	Start         time.Time  `json:"start"`
	End           *time.Time `json:"end"`
	EndedBy       string     `json:"endedBy"`
}

// trailAssignments runs `mig-agent assignments -o json` for node.
func trailAssignments(t *testing.T, o *Opts, extra ...string) []trailEntry {
	t.Helper()
	args := append([]string{"assignments", "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace,
		"--node-name", o.Node, "-o", "json"}, extra...)
	out, errOut, code := RunCLI(t, args...)
	if code != 0 {
		t.Fatalf("assignments: exit %d: %s", code, errOut)
	}
	var doc struct {
		Node    string       `json:"node"`
		Entries []trailEntry `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("assignments -o json: %v\n%s", err, out)
	}
	if doc.Node != o.Node {
		t.Errorf("assignments names node %q, want %q", doc.Node, o.Node)
	}
	return doc.Entries
}

// trailFind returns the entries of pod ns/name.
func trailFind(entries []trailEntry, ns, name string) []trailEntry {
	var out []trailEntry
	for _, e := range entries {
		if e.Namespace == ns && e.Pod == name {
			out = append(out, e)
		}
	}
	return out
}

// trailScrape is the agent's /metrics text, "" while it does not answer
// (it is starting).
func trailScrape(a *Agent) string {
	resp, err := http.Get(a.Metrics + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// trailHeld returns the migagent_mig_device_info series of a scrape,
// sorted.
func trailHeld(metrics string) []string {
	var out []string
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "migagent_mig_device_info{") {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// trailEvents returns the MigDeviceAssigned Events on pod ns/name.
func trailEvents(t *testing.T, c kubernetes.Interface, ns, name string) []corev1.Event {
	t.Helper()
	list, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "reason=MigDeviceAssigned,involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// trailStop deletes a pod as a user does; the kubelet stand-in finishes it
// and drops it from PodResources.
func trailStop(t *testing.T, c kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	err := c.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAssignmentTrail(t *testing.T) {
	c := kubetest.Client(t)
	node, kl, ns := kubeletNode(t)
	o := &Opts{Node: node, Sim: "h200x1", Extra: []string{"--pod-resources-socket", kl.Socket(), "--assignment-interval", "500ms"}}
	a := StartAgent(t, o)
	SelectConfig(t, c, node, "all-1g.18gb")
	rec := WaitState(t, c, node, record.StateSuccess, "all-1g.18gb", 30*time.Second)
	uuids := disMIGUUIDs(disProfiles(t, o.Sim, o.SimState)[0])
	res := "nvidia.com/mig-1g.18gb"
	dev0, dev1, dev2 := uuids["1g.18gb@0"], uuids["1g.18gb@1"], uuids["1g.18gb@2"]

	// Two pods start on the idle node.
	p1 := kl.RunPod(t, ns, "trainer", map[string]string{res: "1"}, map[string][]string{res: {dev0}}, disOwner("rs"))
	p2 := kl.RunPod(t, ns, "notebook", map[string]string{res: "1"}, map[string][]string{res: {dev1}}, disOwner("rs"))
	WaitFor(t, 15*time.Second, "a MigDeviceAssigned Event on each pod", func() bool {
		return len(trailEvents(t, c, ns, "trainer")) == 1 && len(trailEvents(t, c, ns, "notebook")) == 1
	})
	ev := trailEvents(t, c, ns, "trainer")[0]
	for _, want := range []string{dev0, "1g.18gb", "GPU 0", node} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("Event message %q lacks %q", ev.Message, want)
		}
	}
	if ev.InvolvedObject.UID != p1.UID || ev.Type != corev1.EventTypeNormal {
		t.Errorf("Event on %s (%s), want the pod's UID %s, Normal", ev.InvolvedObject.UID, ev.Type, p1.UID)
	}
	wantHeld := []string{
		`migagent_mig_device_info{container="main",gpu="0",namespace="` + ns + `",pod="notebook",profile="1g.18gb",uuid="` + dev1 + `"} 1`,
		`migagent_mig_device_info{container="main",gpu="0",namespace="` + ns + `",pod="trainer",profile="1g.18gb",uuid="` + dev0 + `"} 1`,
	}
	WaitFor(t, 10*time.Second, "the metric to show both pods' devices", func() bool {
		return slices.Equal(trailHeld(trailScrape(a)), wantHeld)
	})

	// One stops: the metric drops it, the history closes it.
	trailStop(t, c, p1)
	WaitFor(t, 15*time.Second, "the metric to show the notebook's device only", func() bool {
		return slices.Equal(trailHeld(trailScrape(a)), wantHeld[:1])
	})
	entries := trailAssignments(t, o)
	tr := trailFind(entries, ns, "trainer")
	if len(tr) != 1 || tr[0].End == nil || tr[0].EndedBy != "gone" || tr[0].Device.UUID != dev0 || tr[0].PodUID != string(p1.UID) {
		t.Fatalf("trainer's entries after it stopped: %+v", tr)
	}
	if e := tr[0]; e.Device.Profile != "1g.18gb" || e.Device.GPU != 0 || e.Device.Placement != "0+1" || e.Container != "main" ||
		e.Change == nil || e.Change.Config != "all-1g.18gb" || e.Change.Hash != rec.ConfigHash || e.Change.Source != rec.ConfigSource ||
		e.DriverVersion == "" || !e.End.After(e.Start) {
		t.Errorf("trainer's entry: %+v (change %+v); want device 1g.18gb GPU 0 at 0+1, the change record's config, hash and source, the driver, end after start", e, e.Change)
	}

	// The agent stops; meanwhile the notebook stops and another pod starts.
	if code := a.Stop(); code != 0 {
		t.Fatalf("agent exited %d", code)
	}
	trailStop(t, c, p2)
	WaitFor(t, 10*time.Second, "the kubelet to finish the notebook", func() bool {
		return slices.Contains(kl.Finished(), ns+"/notebook")
	})
	kl.RunPod(t, ns, "batch", map[string]string{res: "1"}, map[string][]string{res: {dev2}}, disOwner("rs"))
	// A name the API server would refuse, as a kubelet could report it:
	// it is data in the trail, never structure.
	hostile := `evil","end":null},{"namespace":"kube-system","pod":"forged","device":{"uuid":"` + dev0 + `"}` + "\nforged-line"
	kl.Assign(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hostile}}, "main", res, uuids["1g.18gb@3"])

	a = StartAgent(t, o)
	WaitFor(t, 15*time.Second, "the batch pod's Event after the restart", func() bool {
		return len(trailEvents(t, c, ns, "batch")) == 1
	})
	WaitFor(t, 10*time.Second, "the metric to show batch and the hostile name's device", func() bool {
		held := trailHeld(trailScrape(a))
		return len(held) == 2 && strings.Contains(held[0]+held[1], `pod="batch"`)
	})
	entries = trailAssignments(t, o)
	nb := trailFind(entries, ns, "notebook")
	if len(nb) != 1 || nb[0].End == nil || nb[0].EndedBy != "gone-while-down" || nb[0].Device.UUID != dev1 {
		t.Errorf("notebook's entries after the restart: %+v; want one, closed when the agent learnt it was gone", nb)
	}
	if tr2 := trailFind(entries, ns, "trainer"); len(tr2) != 1 || !tr2[0].End.Equal(*tr[0].End) {
		t.Errorf("trainer's entries after the restart: %+v; want the one closed before", tr2)
	}
	if b := trailFind(entries, ns, "batch"); len(b) != 1 || b[0].End != nil || b[0].Device.UUID != dev2 {
		t.Errorf("batch's entries: %+v; want one open on %s", b, dev2)
	}
	if len(trailEvents(t, c, ns, "trainer")) != 1 || len(trailEvents(t, c, ns, "notebook")) != 1 {
		t.Error("the restart posted MigDeviceAssigned again for pods already recorded")
	}
	h := trailFind(entries, ns, hostile)
	if len(h) != 1 || h[0].Device.UUID != uuids["1g.18gb@3"] || h[0].End != nil {
		t.Errorf("hostile name's entries: %+v; want one open, its name verbatim", h)
	}
	if len(entries) != 4 || len(trailFind(entries, "kube-system", "forged")) != 0 {
		t.Errorf("the trail holds %d entries, want 4 (trainer, notebook, batch, the hostile name) and nothing forged: %+v", len(entries), entries)
	}
	// The question an auditor asks: who had the trainer's device while it ran.
	at := tr[0].Start.Add(tr[0].End.Sub(tr[0].Start) / 2)
	who := trailAssignments(t, o, "--device", dev0, "--at", at.UTC().Format(time.RFC3339Nano))
	if len(who) != 1 || who[0].Pod != "trainer" {
		t.Errorf("assignments --device %s --at %s = %+v, want the trainer", dev0, at.Format(time.RFC3339), who)
	}
	// Text output: the hostile name stays on its line, quoted.
	text, _, code := RunCLI(t, "assignments", "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace, "--node-name", node)
	if code != 0 || strings.Contains(text, "\nforged-line") || !strings.Contains(text, "batch") {
		t.Errorf("assignments text (exit %d):\n%s", code, text)
	}
	status, _, code := RunCLI(t, "status", "--kubeconfig", o.Kubeconfig, "--namespace", o.Namespace, "--node", node)
	if code != 0 || !strings.Contains(status, "MIG devices held now (2") || !strings.Contains(status, dev2) {
		t.Errorf("status (exit %d) lacks the devices held now:\n%s", code, status)
	}
}

// Under the shipped policies, only the agent of node A (its
// ServiceAccount, with a token bound to a pod on A) writes A's trail:
// not for node B, not cluster-admin; outside the agent's namespace the
// policy does not apply.
func TestAssignmentTrailPolicy(t *testing.T) {
	admin := kubetest.Client(t)
	in := pkgDescribe(t, pkgPlain(t))
	pkgApply(t, in.objs, false)
	policy := pkgNamed(t, in.objs, "ValidatingAdmissionPolicy", "-assignments").GetName()
	nodeA, nodeB := kubetest.NewName(t, "a"), kubetest.NewName(t, "b")
	kubetest.CreateNode(t, nodeA, nil)
	kubetest.CreateNode(t, nodeB, nil)
	agentA := pkgTokenClient(t, pkgBoundToken(t, in, nodeA))
	cm := func(node string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: node + "-mig-assignments", Namespace: in.namespace},
			Data: map[string]string{"history.json": `{"node":"` + node + `","entries":[]}`}}
	}
	ctx := context.Background()
	t.Cleanup(func() {
		// Only the agent may delete it (where its RBAC lets it): the test cleans up as the agent.
		_ = agentA.CoreV1().ConfigMaps(in.namespace).Delete(context.Background(), nodeA+"-mig-assignments", metav1.DeleteOptions{})
	})
	// The policy is enforced once the API server's informer has it.
	WaitFor(t, policyTimeout, "the policy "+policy+" to refuse cluster-admin", func() bool {
		_, err := admin.CoreV1().ConfigMaps(in.namespace).Create(ctx, cm(nodeA), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return deniedBy(err, policy, "may not")
	})
	if _, err := agentA.CoreV1().ConfigMaps(in.namespace).Create(ctx, cm(nodeA), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the agent of %s cannot write its own trail: %v", nodeA, err)
	}
	got, err := agentA.CoreV1().ConfigMaps(in.namespace).Get(ctx, nodeA+"-mig-assignments", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Data["history.json"] = `{"node":"` + nodeA + `","entries":[],"dropped":1}`
	if _, err := agentA.CoreV1().ConfigMaps(in.namespace).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the agent of %s cannot update its own trail: %v", nodeA, err)
	}
	if _, err := agentA.CoreV1().ConfigMaps(in.namespace).Create(ctx, cm(nodeB), metav1.CreateOptions{}); !deniedBy(err, policy, "only the mig-agent of node "+nodeB) {
		t.Errorf("the agent of %s wrote %s's trail: %v", nodeA, nodeB, err)
	}
	got, err = admin.CoreV1().ConfigMaps(in.namespace).Get(ctx, nodeA+"-mig-assignments", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Data["history.json"] = `{"entries":[]}`
	if _, err := admin.CoreV1().ConfigMaps(in.namespace).Update(ctx, got, metav1.UpdateOptions{}); !deniedBy(err, policy, "may not") {
		t.Errorf("cluster-admin rewrote the trail: %v", err)
	}
	if err := admin.CoreV1().ConfigMaps(in.namespace).Delete(ctx, got.Name, metav1.DeleteOptions{}); !deniedBy(err, policy, "may not") {
		t.Errorf("cluster-admin deleted the trail: %v", err)
	}
	other := kubetest.NewName(t, "elsewhere")
	kubetest.CreateNamespace(t, other)
	if _, err := admin.CoreV1().ConfigMaps(other).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: nodeA + "-mig-assignments", Namespace: other}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("outside the agent's namespace the policy refused: %v", err)
	}
}

// On the DRA path: a pod whose claim the kubelet prepared on a MIG device
// of the NVIDIA DRA driver's slice gets its Event, its series and its entry,
// the device named by UUID and profile through the slice.
func TestAssignmentTrailDRA(t *testing.T) {
	c := kubetest.Client(t)
	node, kl, ns := kubeletNode(t)
	o := (&Opts{Node: node, Sim: "h200x1", Extra: []string{"--pod-resources-socket", kl.Socket(), "--assignment-interval", "500ms"}}).Fill(t)
	if _, errOut, code := RunCLI(t, "apply", "-c", "all-1g.18gb", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState); code != 0 {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	devs := draDevices(t, o)
	kubetest.PublishNVIDIASlice(t, c, node, devs...)
	a := StartAgent(t, o)
	dev := devs[2]
	pod := kl.CreatePod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "claimer"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "mig", ResourceClaimName: ptr.To("claimer-mig")}},
			Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "mig"}}}}},
		}})
	kubetest.AllocateClaim(t, c, ns, "claimer-mig", "mig.nvidia.com", pod,
		kubetest.AllocatedDevice{Driver: dra.NVIDIADRADriver, Pool: node, Device: dev.Name})
	kl.PrepareClaims(t, pod)
	want := `migagent_mig_device_info{container="main",gpu="0",namespace="` + ns + `",pod="claimer",profile="1g.18gb",uuid="` + dev.UUID + `"} 1`
	WaitFor(t, 15*time.Second, "the claimed MIG device in the metric", func() bool {
		return slices.Equal(trailHeld(trailScrape(a)), []string{want})
	})
	WaitFor(t, 10*time.Second, "the MigDeviceAssigned Event", func() bool { return len(trailEvents(t, c, ns, "claimer")) == 1 })
	if ev := trailEvents(t, c, ns, "claimer")[0]; !strings.Contains(ev.Message, dev.UUID) || !strings.Contains(ev.Message, "1g.18gb") {
		t.Errorf("Event message %q", ev.Message)
	}
	trailStop(t, c, pod)
	WaitFor(t, 15*time.Second, "the metric to drop the device", func() bool { return len(trailHeld(trailScrape(a))) == 0 })
	e := trailFind(trailAssignments(t, o), ns, "claimer")
	if len(e) != 1 || e[0].Device.UUID != dev.UUID || e[0].End == nil || e[0].PodUID != string(pod.UID) {
		t.Errorf("claimer's entries: %+v", e)
	}
}
