package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/drain/operandsel"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// defaultSelectors are the operand selectors with no setting.
// daemonSetOwner is the controller reference of a pod a DaemonSet made.
func daemonSetOwner(name string) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: name, UID: "ds-" + types.UID(name), Controller: ptr.To(true)}}
}

func defaultSelectors(t *testing.T) *Selectors {
	t.Helper()
	s, err := ParseSelectors(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// draChartPod is a pod of the DRA driver's kubelet plugin DaemonSet as its
// chart makes it with nameOverride name (dra-driver-nvidia-gpu
// deployments/helm/dra-driver-nvidia-gpu/templates/kubeletplugin.yaml: the
// DaemonSet "<name>-kubelet-plugin", pods labelled
// app.kubernetes.io/name: <name> and "<name>-component: kubelet-plugin",
// the container "gpus" running the plugin from a bash script), ready.
func draChartPod(name, uid string) *corev1.Pod {
	p := readyPod(name+"-kubelet-plugin-x7k2p", uid, map[string]string{
		"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "dra", name + "-component": "kubelet-plugin"})
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: name + "-kubelet-plugin",
		UID: "ds-" + types.UID(name), Controller: ptr.To(true)}}
	p.Spec.Containers = []corev1.Container{
		{Name: "compute-domains", Command: []string{"bash", "-c"}, Args: []string{"compute-domain-kubelet-plugin -v $(LOG_VERBOSITY)"}},
		{Name: "gpus", Command: []string{"bash", "-c"}, Args: []string{
			"# Conditionally mask the params file\nif [ \"${MASK_NVIDIA_DRIVER_PARAMS}\" = \"true\" ]; then\n  mount --bind /root/gpu-params /proc/driver/nvidia/params\nfi\ngpu-kubelet-plugin -v $(LOG_VERBOSITY)"}},
	}
	return p
}

// Each operand is found by its selectors, today's labels by default; an
// operand named in --operand-selector loses its defaults, the others keep
// theirs. The device plugin chart's GFD (same labels as its device
// plugin) is GFD; the DRA kubelet plugin is found by its DaemonSet under
// any chart name.
func TestOperandRoles(t *testing.T) {
	pod := func(name string, l map[string]string) *corev1.Pod { return readyPod(name, "u-"+name, l) }
	computeOnly := draChartPod("cd", "u-cd")
	computeOnly.Spec.Containers = computeOnly.Spec.Containers[:1] // only the ComputeDomain plugin
	bare := draChartPod("bare", "u-bare")
	bare.OwnerReferences = nil // not a DaemonSet's pod
	pods := map[string]*corev1.Pod{
		"operator-dp":    pod("nvidia-device-plugin-daemonset-abc", map[string]string{"app": "nvidia-device-plugin-daemonset"}),
		"chart-dp":       pod("ndp-nvidia-device-plugin-abc", map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}),
		"chart-gfd":      pod("ndp-nvidia-device-plugin-gpu-feature-discovery-abc", map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}),
		"operator-gfd":   pod("gpu-feature-discovery-abc", map[string]string{"app": "gpu-feature-discovery"}),
		"validator":      pod("nvidia-operator-validator-abc", map[string]string{"app": "nvidia-operator-validator"}),
		"dra-default":    draChartPod("dra-driver-nvidia-gpu", "u-dra"),
		"dra-renamed":    draChartPod("gpu-dra", "u-gpu-dra"),
		"dra-nvidia":     draChartPod("nvidia-dra-driver-gpu", "u-nv"),
		"dra-cd-only":    computeOnly,
		"dra-bare":       bare,
		"dcgm-exporter":  pod("nvidia-dcgm-exporter-abc", map[string]string{"app": "nvidia-dcgm-exporter"}),
		"dcgm":           pod("nvidia-dcgm-abc", map[string]string{"app": "nvidia-dcgm"}),
		"my-dp":          pod("my-plugin-abc", map[string]string{"app": "my-nvidia-plugin"}),
		"my-dcgm-export": pod("my-exporter-abc", map[string]string{"app.kubernetes.io/name": "dcgm-exporter"}),
		"workload":       pod("train-0", map[string]string{"app": "train"}),
	}
	roles := func(s *Selectors) map[string]string {
		out := map[string]string{}
		for k, p := range pods {
			out[k] = s.RoleOf(p)
		}
		return out
	}
	want := map[string]string{
		"operator-dp": OperandDevicePlugin, "chart-dp": OperandDevicePlugin, "chart-gfd": OperandGFD, "operator-gfd": OperandGFD,
		"validator": OperandValidator, "dra-default": OperandDRAPlugin, "dra-renamed": OperandDRAPlugin, "dra-nvidia": OperandDRAPlugin,
		"dra-cd-only": "", "dra-bare": "", "dcgm-exporter": OperandDCGMExporter, "dcgm": OperandDCGM,
		"my-dp": "", "my-dcgm-export": "", "workload": "",
	}
	got := roles(defaultSelectors(t))
	for k, w := range want {
		if got[k] != w {
			t.Errorf("defaults: %s is %q, want %q", k, got[k], w)
		}
	}

	s, err := ParseSelectors([]string{"device-plugin=app=my-nvidia-plugin", "dcgm-exporter=app.kubernetes.io/name=dcgm-exporter",
		"dcgm-exporter=app=nvidia-dcgm-exporter"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want["operator-dp"], want["chart-dp"], want["chart-gfd"] = "", "", "" // the device plugin's defaults replaced
	want["my-dp"], want["my-dcgm-export"] = OperandDevicePlugin, OperandDCGMExporter
	got = roles(s)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("named: %s is %q, want %q", k, got[k], w)
		}
	}

	for _, bad := range [][]string{{"device-plugn=app=x"}, {"app=x"}, {"dcgm="}, {"validator=app in (("}} {
		if _, err := ParseSelectors(bad, nil); err == nil || !strings.Contains(err.Error(), "operand-selector") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
	if _, err := ParseSelectors(nil, []string{""}); !errors.Is(err, operandsel.ErrEmptySelector) || !strings.Contains(err.Error(), "plugin-selector") {
		t.Errorf("an empty plugin selector (every pod): %v", err)
	}
}

// The pods restarted after a change are the device plugin, GFD, the
// validator and the DRA kubelet plugin (a nameOverride one found by its
// DaemonSet, with no setting), and what --plugin-selector adds; never
// the DCGM exporter or a workload.
func TestDevicePluginsRestartSet(t *testing.T) {
	objs := []runtime.Object{
		readyPod("operator-plugin", "u1", map[string]string{"app": "nvidia-device-plugin-daemonset"}),
		readyPod("gfd", "u2", map[string]string{"app": "gpu-feature-discovery"}),
		readyPod("validator", "u3", map[string]string{"app": "nvidia-operator-validator"}),
		draChartPod("gpu-dra", "u4"),
		readyPod("exporter", "u5", map[string]string{"app": "nvidia-dcgm-exporter"}),
		readyPod("reader", "u6", map[string]string{"app": "mig-reader"}),
		readyPod("workload", "u7", map[string]string{"app": "train"}),
		readyPod("my-plugin", "u8", map[string]string{"app": "my-nvidia-plugin"}),
	}
	names := func(s *settings.Settings) []string {
		t.Helper()
		k := &Disruptor{Client: clientset.Wrap(fake.NewClientset(objs...)), Log: testsupport.Discard(), Node: "n1", Settings: s}
		got, err := k.DevicePlugins(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range got {
			out = append(out, strings.Split(p, "/")[1])
		}
		return out
	}
	if got := names(&settings.Settings{}); !slices.Equal(got, []string{"gfd", "gpu-dra-kubelet-plugin-x7k2p", "operator-plugin", "validator"}) {
		t.Errorf("defaults: %v", got)
	}
	if got := names(&settings.Settings{PluginSelectors: []string{"app=mig-reader"}}); !slices.Equal(got, []string{"gfd", "gpu-dra-kubelet-plugin-x7k2p", "operator-plugin", "reader", "validator"}) {
		t.Errorf("--plugin-selector: %v", got)
	}
	if got := names(&settings.Settings{OperandSelectors: []string{"device-plugin=app in (my-nvidia-plugin, other)"}}); !slices.Equal(got, []string{"gfd", "gpu-dra-kubelet-plugin-x7k2p", "my-plugin", "validator"}) {
		t.Errorf("renamed device plugin: %v", got)
	}
	k := &Disruptor{Client: clientset.Wrap(fake.NewClientset(objs...)), Log: testsupport.Discard(), Node: "n1",
		Settings: &settings.Settings{OperandSelectors: []string{"validator="}}}
	if _, err := k.DevicePlugins(context.Background()); !errors.Is(err, operandsel.ErrEmptySelector) {
		t.Errorf("an empty selector (every pod) accepted: %v", err)
	}
}

// The selectors are parsed once for the Disruptor's life, not on every
// wait; a bad one is an error, never the defaults in its place.
func TestSelectorsParsedOnce(t *testing.T) {
	calls := 0
	orig := parseSelectors
	t.Cleanup(func() { parseSelectors = orig })
	parseSelectors = func(operand, extra []string) (*Selectors, error) { calls++; return orig(operand, extra) }
	ctx := context.Background()
	c := fake.NewClientset(draSlice(), draChartPod("gpu-dra", "u-new"))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}, PluginSettle: time.Millisecond}
	pods, err := k.DevicePlugins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch := changeOn(record.ServedByDRA, pods...)
	for range 3 {
		if _, ok, err := k.WaitResources(ctx, ch, "mixed", nil, map[string]string{"MIG-a": "1g.18gb"}, time.Second); ok || err == nil {
			t.Fatalf("the plugin of before announces: ok %v, err %v", ok, err)
		}
	}
	if calls != 1 {
		t.Errorf("the selectors parsed %d times", calls)
	}

	bad := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1",
		Settings: &settings.Settings{OperandSelectors: []string{"dra-kubelet-plugin=a in (("}}}
	if waited, ok, err := bad.WaitResources(ctx, changeOn(record.ServedByDRA), "mixed", nil, map[string]string{"MIG-a": "1g.18gb"}, time.Second); waited || ok || err == nil {
		t.Errorf("a bad selector: waited %v ok %v err %v", waited, ok, err)
	}
}

// draSlice announces one MIG device, MIG-a, on n1.
func draSlice() *resourcev1.ResourceSlice {
	return staticSlice("n1", map[string]string{"gpu-0-mig-1g18gb-19-0": "MIG-a"})
}

// On the DRA path only the DRA kubelet plugin's restart proves the slices:
// a GPU Feature Discovery pod of before, still running (its restart
// pending, or its DaemonSet slow), or a validator not Ready, does not hold
// the change back.
func TestDRAFreshJudgesOnlyTheKubeletPlugin(t *testing.T) {
	ctx := context.Background()
	gfdOld := readyPod("gpu-feature-discovery-old", "u-gfd-old", map[string]string{"app": "gpu-feature-discovery"})
	validator := readyPod("nvidia-operator-validator-new", "u-val-new", map[string]string{"app": "nvidia-operator-validator"})
	validator.Status.Phase = corev1.PodPending
	c := fake.NewClientset(draSlice(), draChartPod("gpu-dra", "u-new"), gfdOld, validator)
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
	// Before the change: the old kubelet plugin and GFD.
	ch := changeOn(record.ServedByDRA, "nvidia-dra-driver-gpu/gpu-dra-kubelet-plugin-old/u-old", "nvidia-dra-driver-gpu/gpu-feature-discovery-old/u-gfd-old")
	if waited, ok, err := k.WaitResources(ctx, ch, "mixed", nil, map[string]string{"MIG-a": "1g.18gb"}, 3*time.Second); !waited || !ok || err != nil {
		t.Fatalf("WaitResources = %v, %v, %v", waited, ok, err)
	}
	// The kubelet plugin of before still running holds it back.
	old := draChartPod("gpu-dra", "u-old")
	old.Name = "gpu-dra-kubelet-plugin-old"
	if _, err := c.CoreV1().Pods("nvidia-dra-driver-gpu").Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k2 := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{}}
	ch2 := changeOn(record.ServedByDRA, "nvidia-dra-driver-gpu/gpu-dra-kubelet-plugin-old/u-old")
	if _, ok, err := k2.WaitResources(ctx, ch2, "mixed", nil, map[string]string{"MIG-a": "1g.18gb"}, 1500*time.Millisecond); ok || err == nil ||
		!strings.Contains(err.Error(), "DRA kubelet plugin pod that read the GPUs before the change still runs: nvidia-dra-driver-gpu/gpu-dra-kubelet-plugin-old") {
		t.Fatalf("old kubelet plugin running: ok %v, err %v", ok, err)
	}
}

// A renamed device plugin, named in --operand-selector, is the plugin whose
// restart proves the allocatable on the device plugin path.
func TestWaitResourcesRenamedDevicePlugin(t *testing.T) {
	ctx := context.Background()
	mine := map[string]string{"app": "my-nvidia-plugin"}
	c := fake.NewClientset(swapNode(), readyPod("plugin-old", "u-old", mine))
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", PluginSettle: time.Second,
		Settings: &settings.Settings{OperandSelectors: []string{"device-plugin=app=my-nvidia-plugin"}}}
	if _, _, err := k.ServedBy(ctx); err != nil {
		t.Fatal(err)
	}
	pods, err := k.DevicePlugins(ctx)
	if err != nil || len(pods) != 1 {
		t.Fatalf("DevicePlugins = %v, %v", pods, err)
	}
	ch := changeOn(record.ServedByDevicePlugin, pods...)
	migMode, migDevices := swapExposed()
	if _, ok, err := k.WaitResources(ctx, ch, "mixed", migMode, migDevices, 1500*time.Millisecond); ok || err == nil || !strings.Contains(err.Error(), "plugin-old") {
		t.Fatalf("old plugin running: ok %v, err %v", ok, err)
	}
	if err := c.CoreV1().Pods("nvidia-dra-driver-gpu").Delete(ctx, "plugin-old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods("nvidia-dra-driver-gpu").Create(ctx, readyPod("plugin-new", "u-new", mine), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := k.WaitResources(ctx, ch, "mixed", migMode, migDevices, 10*time.Second); !ok || err != nil {
		t.Fatalf("new plugin Ready: ok %v, err %v", ok, err)
	}
}

// The pause waits for the pods of each paused operand its selectors find
// (a renamed DCGM exporter too, once named) that the GPU Operator deploys
// by the paused label; a pod with no such node selector never leaves and
// is not waited for.
func TestPauseWaitsForSelectedOperands(t *testing.T) {
	const dex = "nvidia.com/gpu.deploy.dcgm-exporter"
	const dp = "nvidia.com/gpu.deploy.device-plugin"
	byOperator := func(name, label string, l map[string]string) corev1.Pod {
		p := readyPod(name, "u-"+name, l)
		p.Spec.NodeSelector = map[string]string{label: "true"}
		return *p
	}
	pods := []corev1.Pod{
		byOperator("exporter", dex, map[string]string{"app": "my-dcgm-exporter"}),
		byOperator("operator-plugin", dp, map[string]string{"app": "nvidia-device-plugin-daemonset"}),
		*readyPod("chart-plugin", "u-chart", map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}),
	}
	ops := []operand{{Label: dex, Operand: OperandDCGMExporter}, {Label: dp, Operand: OperandDevicePlugin}}
	if got := podNames(leaving(pods, ops, defaultSelectors(t))); !slices.Equal(got, []string{"nvidia-dra-driver-gpu/operator-plugin"}) {
		t.Errorf("defaults: waits for %v", got)
	}
	s, err := ParseSelectors([]string{"dcgm-exporter=app=my-dcgm-exporter"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := podNames(leaving(pods, ops, s)); !slices.Equal(got, []string{"nvidia-dra-driver-gpu/exporter", "nvidia-dra-driver-gpu/operator-plugin"}) {
		t.Errorf("named exporter: waits for %v", got)
	}

	// Through pauseOperands: the named exporter that does not leave is
	// what the timeout names.
	ctx := context.Background()
	node := gpuNode(nil)
	node.Labels = map[string]string{dex: "true"}
	objs := []runtime.Object{node}
	for i := range pods {
		objs = append(objs, &pods[i])
	}
	c := clientset.Wrap(fake.NewClientset(objs...))
	saved, err := readOperands(ctx, c, "n1")
	if err != nil {
		t.Fatal(err)
	}
	err = pauseOperands(ctx, c, testsupport.Discard(), "n1", saved, s, time.Second)
	if !errors.Is(err, errOperandsTimeout) || !strings.Contains(err.Error(), "exporter") || strings.Contains(err.Error(), "plugin") {
		t.Errorf("pause: %v", err)
	}
}

// An operand is what it claims only as a DaemonSet's pod in an operand
// namespace: a tenant's pod with the device plugin's labels (in its own
// namespace, or with no controller) is ignored, and named as an impostor.
func TestOperandsAreWhatTheyClaim(t *testing.T) {
	s := defaultSelectors(t).Within(OperandNamespaces(nil, "mig-agent"))
	dpLabels := map[string]string{"app": "nvidia-device-plugin-daemonset"}
	real := readyPod("nvidia-device-plugin-daemonset-abc", "u1", dpLabels)
	real.Namespace = "gpu-operator"
	tenant := readyPod("poser", "u2", dpLabels)
	tenant.Namespace = "team-a" // owned by "a DaemonSet" it may name itself
	bare := readyPod("bare", "u3", dpLabels)
	bare.Namespace, bare.OwnerReferences = "gpu-operator", nil
	byRS := readyPod("byrs", "u4", dpLabels)
	byRS.Namespace, byRS.OwnerReferences = "gpu-operator", []metav1.OwnerReference{*rsOwner("rs")}
	own := readyPod("own", "u5", map[string]string{"app": "mig-reader"})
	own.Namespace = "mig-agent"
	for _, tc := range []struct {
		p    *corev1.Pod
		role string
	}{{real, OperandDevicePlugin}, {tenant, ""}, {bare, ""}, {byRS, ""}} {
		if got := s.RoleOf(tc.p); got != tc.role {
			t.Errorf("%s/%s: role %q, want %q", tc.p.Namespace, tc.p.Name, got, tc.role)
		}
		if got := s.Restarted(tc.p); got != (tc.role != "") {
			t.Errorf("%s/%s: restarted %v", tc.p.Namespace, tc.p.Name, got)
		}
	}
	bad := s.Impostors([]corev1.Pod{*real, *tenant, *bare, *byRS, *own})
	want := []string{
		"gpu-operator/bare (selected as device-plugin; not controlled by a DaemonSet)",
		"gpu-operator/byrs (selected as device-plugin; not controlled by a DaemonSet)",
		"team-a/poser (selected as device-plugin; namespace team-a is not an operand namespace (--operand-namespace: mig-agent, gpu-operator, nvidia-device-plugin, nvidia-dra-driver-gpu, kube-system))",
	}
	if !slices.Equal(bad, want) {
		t.Errorf("Impostors =\n%q\nwant\n%q", bad, want)
	}
	// Named namespaces replace the default, the agent's own included.
	if got := OperandNamespaces([]string{"ops"}, "mig-agent"); !slices.Equal(got, []string{"ops"}) {
		t.Errorf("OperandNamespaces(ops) = %v", got)
	}
	if got := OperandNamespaces(nil, "gpu-operator"); !slices.Equal(got, DefaultOperandNamespaces) {
		t.Errorf("OperandNamespaces(nil, gpu-operator) = %v", got)
	}
}

// A PodDisruptionBudget's 429 is told from the API server's throttling by
// its cause.
func TestBudgetRefused(t *testing.T) {
	pdb := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdb.ErrStatus.Details.Causes = append(pdb.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause,
		Message: "The disruption budget guard needs 1 healthy pods and has 1 currently"})
	if got := budgetRefused(fmt.Errorf("wrapped: %w", pdb)); !strings.Contains(got, "guard needs 1 healthy pods") {
		t.Errorf("budgetRefused(PDB 429) = %q", got)
	}
	if got := budgetRefused(apierrors.NewTooManyRequests("slow down", 1)); got != "" {
		t.Errorf("budgetRefused(throttle) = %q, want empty", got)
	}
	if got := budgetRefused(errors.New("x")); got != "" {
		t.Errorf("budgetRefused(other) = %q", got)
	}
}
