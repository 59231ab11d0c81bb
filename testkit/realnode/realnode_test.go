package realnode_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/realnode"
	"github.com/migagent/mig-agent/testkit/realnode/testplugin"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// TestRealKubeletRunsPod: the real scheduler binds a pod to the real
// kubelet's node, the kubelet runs it in containerd (image built here),
// its PodResources service lists it, an eviction through the Eviction API
// ends it and the kubelet removes it.
func TestRealKubeletRunsPod(t *testing.T) {
	kubetest.StartScheduler(t)
	n := realnode.Start(t)
	c := n.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)

	pod, err := c.CoreV1().Pods(ns).Create(ctx, n.Pod(ns, "sleep", kubetest.SchedulerName), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	pod = waitRunning(ctx, t, c, pod)
	t.Logf("pod %s Running on %s %s after creation (IP %s)", pod.Name, pod.Spec.NodeName, time.Since(t0).Round(time.Millisecond), pod.Status.PodIP)
	if pod.Spec.NodeName != n.Name {
		t.Fatalf("pod bound to %q, want the real node %s", pod.Spec.NodeName, n.Name)
	}
	waitLog(ctx, t, n, pod, "sleep", "sleep")

	list, err := n.ListPodResources(ctx)
	if err != nil {
		t.Fatalf("the kubelet's PodResources List: %v", err)
	}
	if !listed(list.PodResources, pod) {
		t.Fatalf("the kubelet's PodResources List has no %s/%s: %v", ns, pod.Name, list.PodResources)
	}

	t0 = time.Now()
	if err := c.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod.Name}}); err != nil {
		t.Fatalf("evict: %v", err)
	}
	waitGone(ctx, t, c, pod)
	t.Logf("evicted pod gone after %s (the kubelet stopped it and removed it)", time.Since(t0).Round(time.Millisecond))
	list, err = n.ListPodResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if listed(list.PodResources, pod) {
		t.Errorf("PodResources still lists the evicted pod %s/%s", ns, pod.Name)
	}
}

// TestRealKubeletDevicePlugin: a device plugin registering at the real
// kubelet's socket gets its resource into the Node's allocatable; a pod
// asking for one device is admitted, the plugin's Allocate is called, the
// container starts with the answer (a variable, a device node) and
// PodResources lists the device; a pod
// asking for more than there is, bound straight to the node, is refused
// by the kubelet's admission.
func TestRealKubeletDevicePlugin(t *testing.T) {
	kubetest.StartScheduler(t)
	n := realnode.Start(t)
	c := n.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	const res = "example.com/widget"

	// Allocate also passes a device node, as NVIDIA's plugin does with
	// PASS_DEVICE_SPECS: containerd needs it on the host (a host path that
	// is missing fails the container: "failed to generate spec: lstat
	// ...: no such file or directory"); a char device of NVIDIA's major
	// that no driver serves is enough.
	devNode := filepath.Join(t.TempDir(), "widget0")
	if out, err := exec.Command("mknod", devNode, "c", "195", "250").CombinedOutput(); err != nil {
		t.Fatalf("mknod: %v: %s", err, out)
	}
	t0 := time.Now()
	p := testplugin.New(res, "w0", "w1")
	p.Specs = []*pluginapi.DeviceSpec{{HostPath: devNode, ContainerPath: "/dev/widget0", Permissions: "rw"}}
	n.StartPluginWith(t, p)
	waitAllocatable(ctx, t, c, n.Name, res, 2)
	t.Logf("%s=2 in the Node's allocatable %s after registration", res, time.Since(t0).Round(time.Millisecond))

	pod := n.Pod(ns, "one", kubetest.SchedulerName)
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: resource.MustParse("1")}
	pod, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod = waitRunning(ctx, t, c, pod)
	got := p.Allocated()
	if len(got) != 1 || len(got[0]) != 1 {
		t.Fatalf("Allocate calls: %v, want one container with one device", got)
	}
	dev := got[0][0]
	waitLog(ctx, t, n, pod, "sleep", "REALNODE_DEVICES="+dev)
	if fi, err := os.Stat(filepath.Join("/proc", processOf(t, "/pause", pod.Name), "root/dev/widget0")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("the container has no device node /dev/widget0 from Allocate: %v %v", fi, err)
	}
	list, err := n.ListPodResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, pr := range list.PodResources {
		if pr.GetName() != pod.Name || pr.GetNamespace() != ns {
			continue
		}
		for _, ct := range pr.GetContainers() {
			for _, d := range ct.GetDevices() {
				seen = append(seen, fmt.Sprintf("%s/%s:%s", ct.GetName(), d.GetResourceName(), strings.Join(d.GetDeviceIds(), ",")))
			}
		}
	}
	if want := "sleep/" + res + ":" + dev; !slices.Equal(seen, []string{want}) {
		t.Fatalf("PodResources devices of %s: %v, want [%s]", pod.Name, seen, want)
	}

	// Bound by nodeName, past the scheduler: only the kubelet can refuse it.
	big := n.Pod(ns, "three", "")
	big.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: resource.MustParse("3")}
	big, err = c.CoreV1().Pods(ns).Create(ctx, big, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	big = waitPod(ctx, t, c, big, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	t.Logf("over-asking pod refused by the kubelet: %s: %s", big.Status.Reason, big.Status.Message)
	if !strings.Contains(big.Status.Reason, "OutOf") && !strings.Contains(big.Status.Reason, "UnexpectedAdmissionError") {
		t.Errorf("refused with reason %q, want the kubelet's admission (OutOf%s or UnexpectedAdmissionError)", big.Status.Reason, res)
	}
	if got := p.Allocated(); len(got) != 1 {
		t.Errorf("Allocate was called for the refused pod: %v", got)
	}
}

func waitPod(ctx context.Context, t *testing.T, c kubernetes.Interface, pod *corev1.Pod, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	for {
		p, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil {
			last = p
			if ok(p) {
				return p
			}
		}
		select {
		case <-ctx.Done():
			if last != nil {
				t.Fatalf("pod %s/%s not %s: node %q, phase %s, reason %q, message %q, conditions %v, containers %v",
					pod.Namespace, pod.Name, what, last.Spec.NodeName, last.Status.Phase, last.Status.Reason, last.Status.Message,
					last.Status.Conditions, last.Status.ContainerStatuses)
			}
			t.Fatalf("pod %s/%s not %s: %v", pod.Namespace, pod.Name, what, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitRunning(ctx context.Context, t *testing.T, c kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return waitPod(ctx, t, c, pod, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready
	})
}

// waitGone waits until the pod is deleted from the API: with a grace
// period, only the kubelet does that, once its containers stopped.
func waitGone(ctx context.Context, t *testing.T, c kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	for {
		p, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			if err == nil {
				t.Fatalf("pod %s/%s not gone: deletion at %v, phase %s, containers %v", pod.Namespace, pod.Name,
					p.DeletionTimestamp, p.Status.Phase, p.Status.ContainerStatuses)
			}
			t.Fatalf("pod %s/%s not gone: %v", pod.Namespace, pod.Name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func listed(prs []*podresourcesv1.PodResources, pod *corev1.Pod) bool {
	return slices.ContainsFunc(prs, func(p *podresourcesv1.PodResources) bool {
		return p.GetName() == pod.Name && p.GetNamespace() == pod.Namespace
	})
}

func waitLog(ctx context.Context, t *testing.T, n *realnode.Node, pod *corev1.Pod, container, want string) {
	t.Helper()
	var last string
	for {
		s, err := n.ContainerLog(pod, container)
		if err == nil && strings.Contains(s, want) {
			return
		}
		last = fmt.Sprint(s, err)
		select {
		case <-ctx.Done():
			t.Fatalf("the log of %s/%s %s has no %q: %s", pod.Namespace, pod.Name, container, want, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitAllocatable(ctx context.Context, t *testing.T, c kubernetes.Interface, node string, res corev1.ResourceName, want int64) {
	t.Helper()
	var last corev1.ResourceList
	for {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			last = n.Status.Allocatable
			if q, ok := last[res]; ok && q.Value() == want {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %s allocatable %s never %d: %v", node, res, want, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestRealKubeletDaemonSetPlugin: a device plugin runs as a DaemonSet pod
// on the real node, the way NVIDIA's does (privileged, the kubelet's
// device-plugin directory mounted from the host at the same path); the
// DaemonSet controller makes its pod, the kubelet runs it, the plugin
// registers from inside its container, and a pod asking for two devices
// gets both through the plugin's Allocate.
func TestRealKubeletDaemonSetPlugin(t *testing.T) {
	kubetest.StartScheduler(t)
	n := realnode.Start(t)
	c := n.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := kubetest.NewName(t, "ns")
	kubetest.CreateNamespace(t, ns)
	const res = "example.com/gadget"

	// The plugin built with cgo, linked to this machine's glibc, as
	// NVIDIA's is: its image holds the libraries ldd finds.
	bin := filepath.Join(t.TempDir(), "deviceplugin")
	build := exec.Command("go", "build", "-o", bin, "./testkit/realnode/deviceplugin")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the plugin with cgo: %v\n%s", err, out)
	}
	files, err := realnode.BinaryFiles(bin, "/deviceplugin")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("the cgo plugin links no shared library (%v): this test wants a dynamic program", files)
	}
	const image = "mig-agent.test/device-plugin:cgo"
	if err := n.ImportImage(image, []string{"/deviceplugin"}, files); err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: %d files (the plugin and its libraries)", image, len(files))

	labels := map[string]string{"app": "gadget-plugin"}
	dir := n.DevicePluginDir()
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gadget-plugin"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// The DaemonSet controller leaves binding to the
					// scheduler; the test's scheduler binds only its
					// own profile's pods.
					SchedulerName: kubetest.SchedulerName,
					NodeSelector:  map[string]string{corev1.LabelHostname: n.Name},
					Tolerations:   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "plugin", Image: image, ImagePullPolicy: corev1.PullNever,
						Args:            []string{res, "g0", "g1", "g2"},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts:    []corev1.VolumeMount{{Name: "device-plugin", MountPath: dir}},
					}},
					Volumes: []corev1.Volume{{Name: "device-plugin", VolumeSource: corev1.VolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: dir},
					}}},
					TerminationGracePeriodSeconds: ptr.To[int64](5),
				},
			},
		},
	}
	t0 := time.Now()
	if _, err := c.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(ctx, t, c, n.Name, res, 3)
	t.Logf("%s=3 in the Node's allocatable %s after the DaemonSet's creation", res, time.Since(t0).Round(time.Millisecond))

	pod := n.Pod(ns, "two", kubetest.SchedulerName)
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: resource.MustParse("2")}
	pod, err = c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod = waitRunning(ctx, t, c, pod)
	waitLog(ctx, t, n, pod, "sleep", "REALNODE_DEVICES=g")
	log, _ := n.ContainerLog(pod, "sleep")
	_, devs, _ := strings.Cut(log, "REALNODE_DEVICES=")
	devs, _, _ = strings.Cut(devs, "\n")
	if got := strings.Split(devs, ","); len(got) != 2 {
		t.Fatalf("the container got devices %q from Allocate, want two of g0,g1,g2", devs)
	}
}

// processOf returns the pid of the one process whose command line is args.
func processOf(t *testing.T, args ...string) string {
	t.Helper()
	want := strings.Join(args, "\x00") + "\x00"
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		if b, err := os.ReadFile(f); err == nil && string(b) == want {
			return filepath.Base(filepath.Dir(f))
		}
	}
	t.Fatalf("no process %q", args)
	return ""
}
