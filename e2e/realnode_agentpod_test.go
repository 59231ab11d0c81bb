package e2e

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/kubetest/audit"
	"github.com/migagent/mig-agent/testkit/realnode"
)

// The agent as users run it first: the plain manifests
// (packaging/kubernetes: namespace, ServiceAccount, RBAC, admission
// policies, settings, DaemonSet) applied as they are, the DaemonSet's pod
// made by the real DaemonSet controller and run by the real kubelet, with
// the ServiceAccount token the kubelet requests for that pod: the API
// server names the pod's node in it, which the admission policy
// mig-agent-node-scope requires of every write to a Node.
//
// Changed in the manifests, each for what this machine lacks: the image is
// the tests' binary with the simulated NVML library (--nvml real on it, the
// simulator's state in a host directory; no driver injects an NVML here);
// the pod runs on the host's network and reaches the API server at its
// address (KUBERNETES_SERVICE_HOST: no service proxy here gives the
// kubernetes Service an address); the PodResources and journal host paths
// are the real node's (its kubelet's root is not /var/lib/kubelet); no
// D-Bus socket is mounted and reboot-method is none (no system bus); the
// tests' scheduler binds the pod, and the node's name is added to the
// nodeSelector (the API server is shared with other tests' Nodes); the
// tests' API server runs without the ServiceAccount admission plugin (no
// controller makes each namespace's default ServiceAccount), so the pod
// template carries the token volume that plugin adds, and the
// kube-root-ca.crt ConfigMap, which a controller-manager's root CA
// publisher would write, is written by the test.

// agentImage is the agent's test image.
const agentImage = "mig-agent.test/mig-agent:e2e"

// TestRealNodeAgentInItsPod: the packaged DaemonSet runs the agent on the
// real node; its pod becomes Ready (its readiness probe: the Node watch
// synced, NVML open), and a label change evicts nothing it should not,
// restarts NVIDIA's plugin and ends in success with the exact allocatable,
// every write made with the pod's own token through the RBAC and the
// admission policies of the manifests.
func TestRealNodeAgentInItsPod(t *testing.T) {
	n := startRealGPUNode(t, "h200x1", defaultConfigs, "all-1g.18gb", "mixed", "")
	n.waitAllocatable(t, map[string]int64{"nvidia.com/mig-1g.18gb": 7}, 90*time.Second)
	c := n.Client

	in := pkgDescribe(t, pkgPlain(t))
	if in.namespace != "mig-agent" {
		t.Fatalf("the manifests' namespace is %q", in.namespace)
	}
	files, err := realnode.BinaryFiles(binary(), "/usr/bin/mig-agent")
	if err != nil {
		t.Fatal(err)
	}
	lib, err := realnode.BinaryFiles(n.Lib, "/usr/lib/mig-agent-sim/libnvidia-ml.so.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range lib {
		if !slices.ContainsFunc(files, func(g realnode.ImageFile) bool { return g.Path == f.Path }) {
			files = append(files, f)
		}
	}
	if err := n.ImportImage(agentImage, []string{"/usr/bin/mig-agent"}, files); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(n.Dir, "mig-agent-state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, o := range in.objs {
		switch {
		case o.GetKind() == "DaemonSet":
			n.adaptAgentDaemonSet(t, o, state)
		case o.GetKind() == "ConfigMap" && o.GetName() == "mig-agent-settings":
			settings, _, _ := unstructured.NestedString(o.Object, "data", "settings.yaml")
			settings += "reboot-method: none\n"
			if err := unstructured.SetNestedField(o.Object, settings, "data", "settings.yaml"); err != nil {
				t.Fatal(err)
			}
		}
	}
	pkgApply(t, in.objs, false)
	t.Cleanup(func() {
		// No garbage collector runs here to delete the DaemonSet's pods:
		// the test does, and the agent ends on SIGTERM.
		ctx := context.Background()
		_ = c.AppsV1().DaemonSets(in.namespace).Delete(ctx, "mig-agent", metav1.DeleteOptions{})
		_ = c.CoreV1().Pods(in.namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=mig-agent"})
		WaitFor(t, time.Minute, "the agent's pod gone", func() bool {
			list, err := c.CoreV1().Pods(in.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=mig-agent"})
			return err == nil && len(list.Items) == 0
		})
	})
	caConfigMap(t, in.namespace)
	SetLabel(t, c, n.Name, "nvidia.com/gpu.present", "true", "nfd-master")

	var pod corev1.Pod
	t.Cleanup(func() {
		if t.Failed() && pod.Name != "" {
			if log, err := n.ContainerLog(&pod, "mig-agent"); err == nil {
				t.Logf("the agent's log:\n%s", lastLines(log, 60))
			} else {
				t.Logf("the agent's log: %v", err)
			}
		}
	})
	WaitFor(t, 2*time.Minute, "the agent's pod Ready", func() bool {
		pods := agentPods(t, n)
		if len(pods) != 1 {
			return false
		}
		pod = pods[0]
		if s := pod.Status.ContainerStatuses; len(s) == 1 && s[0].RestartCount > 0 {
			t.Fatalf("the agent's container restarted: %+v", s[0].LastTerminationState)
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	old := n.pluginPods(t)
	t0 := time.Now()
	SelectConfig(t, c, n.Name, "all-3g.71gb")
	WaitState(t, c, n.Name, record.StateSuccess, "all-3g.71gb", 3*time.Minute)
	t.Logf("success %s after the label, from the agent's pod", time.Since(t0).Round(100*time.Millisecond))
	if got := gpuAllocatable(GetNode(t, c, n.Name)); !sameCounts(got, map[string]int64{"nvidia.com/mig-3g.71gb": 2}) || len(got) != 1 {
		t.Errorf("allocatable at success %v, want 2 mig-3g.71gb", got)
	}
	if !n.pluginReplaced(t, old) {
		t.Errorf("the plugin's pod was not replaced")
	}
	// The agent's requests went with the pod's own token, which names the
	// pod's node: the admission policy mig-agent-node-scope lets a write to
	// a Node through only then, so the state labels above prove it for
	// the Node; the audit log (which the tests' server keeps for Leases)
	// shows it for the agent's node Lease.
	time.Sleep(time.Second) // the last responses are logged
	evs, err := audit.Read(kubetest.AuditLog(t), pod.CreationTimestamp.Time, time.Time{}, func(e audit.Event) bool {
		return e.Resource() == "leases" && strings.HasPrefix(e.UserAgent, "mig-agent/") &&
			slices.Equal(e.User.Extra["authentication.kubernetes.io/pod-name"], []string{pod.Name})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.User.Username != "system:serviceaccount:mig-agent:mig-agent" || !slices.Equal(e.User.Extra["authentication.kubernetes.io/node-name"], []string{n.Name}) || e.Code() >= 300 && e.Code() != 404 {
			t.Errorf("a %s of Lease %s by %s (extra %v): %d", e.Verb, e.Name(), e.User.Username, e.User.Extra, e.Code())
		}
	}
	if len(evs) == 0 {
		t.Errorf("no request of the agent's pod on a Lease in the audit log")
	}
	now := agentPods(t, n)
	if len(now) != 1 || now[0].UID != pod.UID || now[0].Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the agent's pod changed or restarted during the change: %d pods", len(now))
	}
}

// adaptAgentDaemonSet changes the packaged DaemonSet only where this
// machine lacks what a GPU node has (see the comment at the top).
func (n *realGPUNode) adaptAgentDaemonSet(t *testing.T, ds *unstructured.Unstructured, state string) {
	t.Helper()
	u, err := url.Parse(kubetest.RestConfig(t).Host)
	if err != nil {
		t.Fatal(err)
	}
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	spec["hostNetwork"] = true
	spec["schedulerName"] = kubetest.SchedulerName
	sel, _, _ := unstructured.NestedStringMap(spec, "nodeSelector")
	sel[corev1.LabelHostname] = n.Name
	_ = unstructured.SetNestedStringMap(spec, sel, "nodeSelector")
	containers, _, _ := unstructured.NestedSlice(spec, "containers")
	ctr := containers[0].(map[string]any)
	ctr["image"], ctr["imagePullPolicy"] = agentImage, "Never"
	args, _, _ := unstructured.NestedStringSlice(ctr, "args")
	args = append(args, "--nvml=real", "--nvml-library=/usr/lib/mig-agent-sim/libnvidia-ml.so.1",
		"--operand-namespace="+n.PluginNS, "--resource-wait-timeout=3m")
	_ = unstructured.SetNestedStringSlice(ctr, args, "args")
	env, _, _ := unstructured.NestedSlice(ctr, "env")
	for _, e := range [][2]string{{"MIG_AGENT_SIM", n.Spec}, {"MIG_AGENT_SIM_STATE", "/sim/state.json"}, {"MIG_AGENT_SIM_QUIET", "1"},
		{"KUBERNETES_SERVICE_HOST", u.Hostname()}, {"KUBERNETES_SERVICE_PORT", u.Port()}} {
		env = append(env, map[string]any{"name": e[0], "value": e[1]})
	}
	ctr["env"] = env
	var mounts []any
	ms, _, _ := unstructured.NestedSlice(ctr, "volumeMounts")
	for _, m := range ms {
		if m.(map[string]any)["name"] != "dbus" {
			mounts = append(mounts, m)
		}
	}
	ctr["volumeMounts"] = append(mounts, map[string]any{"name": "sim", "mountPath": "/sim"},
		map[string]any{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true})
	containers[0] = ctr
	spec["containers"] = containers
	var volumes []any
	vs, _, _ := unstructured.NestedSlice(spec, "volumes")
	for _, v := range vs {
		vol := v.(map[string]any)
		switch vol["name"] {
		case "dbus":
			continue
		case "pod-resources":
			vol["hostPath"] = map[string]any{"path": filepath.Dir(n.PodResourcesSocket()), "type": "Directory"}
		case "state":
			vol["hostPath"] = map[string]any{"path": state, "type": "DirectoryOrCreate"}
		}
		volumes = append(volumes, vol)
	}
	// The volume the ServiceAccount admission plugin adds to every pod
	// (plugin/pkg/admission/serviceaccount, TokenVolumeSource): the token
	// the kubelet requests for this pod, the CA and the namespace.
	spec["volumes"] = append(volumes, map[string]any{"name": "sim", "hostPath": map[string]any{"path": filepath.Dir(n.State)}},
		map[string]any{"name": "kube-api-access", "projected": map[string]any{"defaultMode": int64(0o644), "sources": []any{
			map[string]any{"serviceAccountToken": map[string]any{"path": "token", "expirationSeconds": int64(3607)}},
			map[string]any{"configMap": map[string]any{"name": "kube-root-ca.crt", "items": []any{map[string]any{"key": "ca.crt", "path": "ca.crt"}}}},
			map[string]any{"downwardAPI": map[string]any{"items": []any{map[string]any{"path": "namespace",
				"fieldRef": map[string]any{"apiVersion": "v1", "fieldPath": "metadata.namespace"}}}}},
		}}})
	if err := unstructured.SetNestedMap(ds.Object, spec, "spec", "template", "spec"); err != nil {
		t.Fatal(err)
	}
}

// agentPods are the agent's pods on the node that are not being deleted.
func agentPods(t *testing.T, n *realGPUNode) []corev1.Pod {
	return n.podsIn(t, "mig-agent", map[string]string{"app.kubernetes.io/name": "mig-agent"})
}

// caConfigMap writes kube-root-ca.crt in ns, as the controller-manager's
// root CA publisher does: the CA of the server, which the kubelet mounts
// into every pod with the ServiceAccount token.
func caConfigMap(t *testing.T, ns string) {
	t.Helper()
	cfg := kubetest.RestConfig(t)
	ca := cfg.CAData
	if len(ca) == 0 {
		var err error
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(ca)}}
	if _, err := kubetest.Client(t).CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
