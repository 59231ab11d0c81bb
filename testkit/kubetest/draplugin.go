package kubetest

import (
	"context"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// Labels of the NVIDIA DRA driver's kubelet plugin pods, as its Helm chart
// gives them with the default name (deployments/helm/dra-driver-nvidia-gpu,
// templates/_helpers.tpl templateLabels and selectorLabels,
// templates/kubeletplugin.yaml).
const (
	DRAPluginComponentLabel = "dra-driver-nvidia-gpu-component"
	DRAPluginComponent      = "kubelet-plugin"
	draChartName            = "dra-driver-nvidia-gpu"
)

// draPluginScript is how the driver's chart starts the GPU kubelet plugin
// in the container "gpus" (templates/kubeletplugin.yaml).
const draPluginScript = `# Conditionally mask the params file to prevent this container from
# recreating any missing GPU device nodes.
if [ "${MASK_NVIDIA_DRIVER_PARAMS}" = "true" ]; then
  cp /proc/driver/nvidia/params /root/gpu-params
  sed -i 's/^ModifyDeviceFiles: 1$/ModifyDeviceFiles: 0/' /root/gpu-params
  mount --bind /root/gpu-params /proc/driver/nvidia/params
fi
gpu-kubelet-plugin -v $(LOG_VERBOSITY)`

// DRAPlugin plays the NVIDIA DRA driver's kubelet plugin on one node,
// without DynamicMIG, run as its chart runs it: a DaemonSet (real, and
// driven by the real DaemonSet controller, which makes a new pod when the
// pod is evicted) whose pod, once bound and started here, enumerates the
// GPUs once (read) and publishes them through
// k8s.io/dynamic-resource-allocation/resourceslice, the library the real
// driver publishes with (kubeletplugin.Helper.PublishResources, a Node
// owner: one pool named after the node, spec.nodeName set). As the real
// driver (cmd/gpu-kubelet-plugin driver.go NewDriver → NewDeviceState →
// enumerateAllPossibleDevices "called once upon startup", then
// publishResources), it never enumerates again: the GPUs changing under it
// change nothing it announces until its pod is replaced. Its slices stay
// when the pod stops; the next pod's controller takes them over and
// updates them.
type DRAPlugin struct {
	t      testing.TB
	client kubernetes.Interface
	node   string
	read   func() ([]NVIDIADevice, error)
	loop   *podLoop

	mu      sync.Mutex
	running string // UID of the pod whose plugin runs, "" none
	starts  int
	ctrl    *resourceslice.Controller
	cancel  context.CancelFunc
}

// StartDRAPlugin creates the kubelet plugin DaemonSet for node in namespace
// ns, reports the node Ready, and plays the plugin until the test ends.
// read enumerates the devices as the driver names them.
func StartDRAPlugin(t testing.TB, client kubernetes.Interface, node, ns string, read func() ([]NVIDIADevice, error)) *DRAPlugin {
	t.Helper()
	return StartDRAPluginNamed(t, client, node, ns, draChartName, read)
}

// StartDRAPluginNamed is StartDRAPlugin for the driver's chart installed
// with nameOverride name: its pods' labels are app.kubernetes.io/name: name
// and "<name>-component: kubelet-plugin" (the chart's _helpers.tpl
// selectorLabels, which build both from the chart name).
func StartDRAPluginNamed(t testing.TB, client kubernetes.Interface, node, ns, name string, read func() ([]NVIDIADevice, error)) *DRAPlugin {
	t.Helper()
	p := &DRAPlugin{t: t, client: client, node: node, read: read}
	readyForDaemonSet(t, client, node, nil)
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "dra",
		name + "-component": DRAPluginComponent, nodeLabel: node}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubelet-plugin-" + shortName(node), Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:      map[string]string{nodeLabel: node},
					Tolerations:       []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					PriorityClassName: "system-node-critical",
					// The chart's container: the plugin started from a
					// bash script (templates/kubeletplugin.yaml).
					Containers: []corev1.Container{{Name: "gpus", Image: "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1",
						Command: []string{"bash", "-c"}, Args: []string{draPluginScript}}},
				},
			},
		},
	}
	p.loop = runDaemonSet(t, client, node, ds, p.start, p.stop)
	t.Cleanup(p.stopController)
	return p
}

// Starts counts the plugin's starts (each one enumerates the GPUs).
func (p *DRAPlugin) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Counted reports whether a plugin pod runs and its DaemonSet counts it.
func (p *DRAPlugin) Counted() bool { return p.Running() && p.loop.counted() }

// Running reports whether a plugin pod runs on the node now.
func (p *DRAPlugin) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running != ""
}

func (p *DRAPlugin) start(ctx context.Context, pod *corev1.Pod) {
	devs, err := p.read()
	if err != nil {
		p.t.Logf("DRA plugin %s: enumerating the GPUs: %v", p.node, err)
		return
	}
	// The real plugin lists its devices from Go maps (driver.go
	// publishResources: range perGPUAllocatable.allocatablesMap, then each
	// GPU's devices): their order changes from start to start.
	devices := apiDevices(devs)
	rand.Shuffle(len(devices), func(i, j int) { devices[i], devices[j] = devices[j], devices[i] })
	resources := &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		p.node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
	p.stopController()
	cctx, cancel := context.WithCancel(context.Background())
	delay := 100 * time.Millisecond
	ctrl, err := resourceslice.StartController(cctx, resourceslice.Options{
		DriverName: nvidiaDRADriver, KubeClient: p.client,
		Owner:     &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.node},
		Resources: resources, SyncDelay: &delay,
	})
	if err != nil {
		cancel()
		p.t.Logf("DRA plugin %s: publishing: %v", p.node, err)
		return
	}
	p.mu.Lock()
	p.running, p.ctrl, p.cancel = string(pod.UID), ctrl, cancel
	p.starts++
	p.mu.Unlock()
	markRunning(ctx, p.t, p.client, pod)
}

// stop ends the plugin of pod, if it is the one running; its slices stay.
func (p *DRAPlugin) stop(_ context.Context, pod *corev1.Pod) {
	p.mu.Lock()
	mine := p.running == string(pod.UID)
	if mine {
		p.running = ""
	}
	p.mu.Unlock()
	if mine {
		p.stopController()
	}
}

func (p *DRAPlugin) stopController() {
	p.mu.Lock()
	ctrl, cancel := p.ctrl, p.cancel
	p.ctrl, p.cancel = nil, nil
	p.mu.Unlock()
	if ctrl != nil {
		ctrl.Stop()
		cancel()
	}
}

// apiDevices are the devices as the driver announces them
// (deviceinfo.go GpuInfo.Attributes / MigDeviceInfo.GetDevice: type, uuid,
// and for MIG devices parentUUID and profile; the other attributes and the
// capacities nvidiadra.Details reads).
func apiDevices(devs []NVIDIADevice) []resourcev1.Device {
	out := make([]resourcev1.Device, 0, len(devs))
	for _, d := range devs {
		str := func(v string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(v)} }
		attrs := maps.Clone(d.Attributes)
		if attrs == nil {
			attrs = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
		}
		attrs["type"], attrs["uuid"] = str("gpu"), str(d.UUID)
		if d.ParentUUID != "" {
			attrs["type"], attrs["parentUUID"], attrs["profile"] = str("mig"), str(d.ParentUUID), str(d.Profile)
		}
		out = append(out, resourcev1.Device{Name: d.Name, Attributes: attrs, Capacity: maps.Clone(d.Capacity)})
	}
	return out
}
