package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

// migDeviceClass is the NVIDIA DRA driver's DeviceClass for MIG devices,
// its selector verbatim from the driver's chart
// (deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-mig.yaml).
const (
	migDeviceClass    = "mig.nvidia.com"
	migDeviceClassCEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
)

// ensureMIGDeviceClass creates the chart's mig.nvidia.com DeviceClass, or
// checks that the one there has the chart's selector. A class created here
// is deleted when the test ends.
func ensureMIGDeviceClass(t testing.TB, c kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	dc := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: migDeviceClass},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: migDeviceClassCEL}}}}}
	_, err := c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
	switch {
	case err == nil:
		t.Cleanup(func() {
			_ = c.ResourceV1().DeviceClasses().Delete(context.Background(), migDeviceClass, metav1.DeleteOptions{})
		})
	case apierrors.IsAlreadyExists(err):
		got, gerr := c.ResourceV1().DeviceClasses().Get(ctx, migDeviceClass, metav1.GetOptions{})
		if gerr != nil || len(got.Spec.Selectors) != 1 || got.Spec.Selectors[0].CEL == nil || got.Spec.Selectors[0].CEL.Expression != migDeviceClassCEL {
			t.Fatalf("DeviceClass %s exists but is not the chart's: %v %v", migDeviceClass, got, gerr)
		}
	default:
		t.Fatalf("create DeviceClass %s: %v", migDeviceClass, err)
	}
}

// reportCapacity writes what the kubelet reports of a node's capacity (the
// scheduler's NodeResourcesFit plugin counts pods against allocatable.pods),
// keeping the Ready condition the plugin stand-in reported.
func reportCapacity(t testing.TB, c kubernetes.Interface, node string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		res := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
			corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi")}
		n.Status.Capacity, n.Status.Allocatable = res, res
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("node %s capacity: %v", node, err)
	}
}

// profileClaimPod creates a ResourceClaimTemplate asking for one device of
// class mig.nvidia.com whose profile attribute (the driver's deviceinfo.go
// / mig.go CommonAttributesMig) is profile, and a pod using it through the
// test scheduler.
func profileClaimPod(t testing.TB, c kubernetes.Interface, ns, name, profile string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	tmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "mig", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: migDeviceClass,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
					Expression: `device.attributes["gpu.nvidia.com"].profile == "` + profile + `"`}}},
			}}}}}}}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaimTemplate %s/%s: %v", ns, name, err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			SchedulerName:  kubetest.SchedulerName,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "mig", ResourceClaimTemplateName: ptr.To(name)}},
			Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "mig"}}}}},
		}}
	out, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return out
}

// podClaim returns the pod's ResourceClaim made from its template (the
// name the resourceclaim controller wrote in status.resourceClaimStatuses),
// or nil while there is none.
func podClaim(t testing.TB, c kubernetes.Interface, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	p, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == "mig" && s.ResourceClaimName != nil {
			claim, err := c.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return claim
		}
	}
	return nil
}

// waitBound waits until the scheduler bound pod and allocated its claim,
// and returns the node and the claim's device (pool/device checked against
// node and the driver).
func waitBound(t testing.TB, c kubernetes.Interface, pod *corev1.Pod, node string, timeout time.Duration) string {
	t.Helper()
	var device string
	WaitFor(t, timeout, "pod "+pod.Name+" bound with its claim allocated", func() bool {
		p, err := c.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName == "" {
			return false
		}
		claim := podClaim(t, c, pod)
		if claim == nil || claim.Status.Allocation == nil {
			return false
		}
		res := claim.Status.Allocation.Devices.Results
		if len(res) != 1 || res[0].Driver != dra.NVIDIADRADriver || res[0].Pool != node || p.Spec.NodeName != node {
			t.Fatalf("pod on %q, claim %s allocated %+v; want one %s device of pool %s", p.Spec.NodeName, claim.Name, res, dra.NVIDIADRADriver, node)
		}
		if !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool { return r.UID == pod.UID }) {
			return false
		}
		device = res[0].Device
		return true
	})
	return device
}

// waitUnschedulable waits for the scheduler to mark pod unschedulable, then
// checks that it stays unbound and its claim unallocated for hold.
func waitUnschedulable(t testing.TB, c kubernetes.Interface, pod *corev1.Pod, hold time.Duration) {
	t.Helper()
	get := func() *corev1.Pod {
		p, err := c.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	WaitFor(t, 60*time.Second, "pod "+pod.Name+" PodScheduled=False Unschedulable", func() bool {
		return slices.ContainsFunc(get().Status.Conditions, func(cd corev1.PodCondition) bool {
			return cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse && cd.Reason == corev1.PodReasonUnschedulable
		})
	})
	for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if p := get(); p.Spec.NodeName != "" {
			t.Fatalf("pod %s was bound to %s; no announced device has its profile", pod.Name, p.Spec.NodeName)
		}
		if claim := podClaim(t, c, pod); claim != nil && claim.Status.Allocation != nil {
			t.Fatalf("claim %s allocated %+v; no announced device has its profile", claim.Name, claim.Status.Allocation.Devices.Results)
		}
	}
}

// The real kube-scheduler allocates ResourceClaims, made from
// ResourceClaimTemplates by the real resourceclaim controller, to the MIG
// devices the DRA plugin (stand-in publishing through the driver's library)
// announces, under the driver's mig.nvidia.com DeviceClass, and binds the
// pod; a claim for a profile not announced leaves its pod unschedulable.
// Then the real agent changes the other GPU's geometry; once the plugin,
// restarted by the agent, announces the new devices, the scheduler
// allocates the waiting claim and binds its pod.
func TestDRASchedulerAllocatesMIGClaim(t *testing.T) {
	c := kubetest.Client(t)
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	drv, work := kubetest.NewName(t, "dra"), kubetest.NewName(t, "ml")
	kubetest.CreateNamespace(t, drv)
	kubetest.CreateNamespace(t, work)
	kl := kubetest.StartKubelet(t, c, node)
	cfg := disConfig(t, `version: v1
mig-configs:
  before:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "2g.35gb": 3
  after:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2
`)
	o := (&Opts{Node: node, Sim: "h200x2", Extra: []string{"-f", cfg, "--pod-resources-socket", kl.Socket(),
		"--resource-wait-timeout", "60s", "--operand-namespace", drv}}).Fill(t)
	// The MIG devices exist before the driver starts (pre-created).
	if _, errOut, code := RunCLI(t, "apply", "-f", cfg, "-c", "before", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState); code != 0 {
		t.Fatalf("apply before: exit %d: %s", code, errOut)
	}
	before := draDevices(t, o)
	dp := kubetest.StartDRAPlugin(t, c, node, drv, func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
	WaitFor(t, 60*time.Second, "the DRA plugin to publish", func() bool { return dp.Counted() && slices.Equal(announced(t, c, node), names(before)) })
	reportCapacity(t, c, node)
	ensureMIGDeviceClass(t, c)
	kubetest.StartControllers(t, "resourceclaim-controller")
	kubetest.StartScheduler(t)

	// A 1g.18gb claim: allocated to an announced 1g.18gb device, pod bound.
	small := profileClaimPod(t, c, work, "small", "1g.18gb")
	dev := waitBound(t, c, small, node, 60*time.Second)
	if !slices.ContainsFunc(before, func(d kubetest.NVIDIADevice) bool { return d.Name == dev && d.Profile == "1g.18gb" }) {
		t.Fatalf("claim allocated device %s; want an announced 1g.18gb device of %v", dev, names(before))
	}
	t.Logf("1g.18gb claim allocated %s, pod bound to %s", dev, node)
	// The kubelet prepares the bound pod's claim before its containers start.
	bound, err := c.CoreV1().Pods(work).Get(context.Background(), small.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kl.PrepareClaims(t, bound)

	// A pod for the default scheduler: not this scheduler's to place.
	other, err := c.CoreV1().Pods(work).Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10"}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A 3g.71gb claim: no such device is announced.
	big := profileClaimPod(t, c, work, "big", "3g.71gb")
	waitUnschedulable(t, c, big, 5*time.Second)
	if p, err := c.CoreV1().Pods(work).Get(context.Background(), other.Name, metav1.GetOptions{}); err != nil ||
		p.Spec.NodeName != "" || len(p.Status.Conditions) != 0 {
		t.Fatalf("the test scheduler touched a default-scheduler pod: node %q conditions %v (%v)", p.Spec.NodeName, p.Status.Conditions, err)
	}

	// The agent makes GPU 1 two 3g.71gb devices and restarts the plugin;
	// the scheduler then allocates the waiting claim.
	StartAgent(t, o)
	SelectConfig(t, c, node, "after")
	rec := WaitState(t, c, node, record.StateSuccess, "after", 90*time.Second)
	if rec.ServedBy != record.ServedByDRA || len(rec.EvictedPods) != 0 {
		t.Errorf("record servedBy %q evictedPods %v; want dra, none (nothing held GPU 1)", rec.ServedBy, rec.EvictedPods)
	}
	after := draDevices(t, o)
	dev = waitBound(t, c, big, node, 60*time.Second)
	if !slices.ContainsFunc(after, func(d kubetest.NVIDIADevice) bool { return d.Name == dev && d.Profile == "3g.71gb" }) ||
		!strings.HasPrefix(dev, "gpu-1-mig-3g71gb-") {
		t.Fatalf("claim allocated device %s; want a new 3g.71gb device of %v", dev, names(after))
	}
	t.Logf("after the change, the 3g.71gb claim allocated %s, pod bound", dev)
	if p, err := c.CoreV1().Pods(work).Get(context.Background(), "small", metav1.GetOptions{}); err != nil || p.UID != small.UID || p.DeletionTimestamp != nil {
		t.Errorf("the pod on GPU 0, which did not change: %v, %v", p, err)
	}
}
