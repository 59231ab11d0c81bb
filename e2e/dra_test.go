package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/testkit/clientset"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/kubetest/nvidiadra"
)

// draGPU is one GPU of `mig-agent profiles -o json`, with what the NVIDIA
// DRA driver names its devices by.
type draGPU struct {
	Index    int                    `json:"index"`
	UUID     string                 `json:"uuid"`
	MigMode  struct{ Current bool } `json:"migMode"`
	Profiles []struct {
		Name string `json:"name"`
		ID   int    `json:"id"`
	} `json:"profiles"`
	Instances []struct {
		Profile string `json:"profile"`
		Start   int    `json:"start"`
		UUID    string `json:"uuid"`
	} `json:"instances"`
}

var notRFC1123 = regexp.MustCompile(`[^a-z0-9-.]`)

// draDeviceName is the driver's canonical name of a MIG device
// (cmd/gpu-kubelet-plugin mig.go MigSpecTuple.ToCanonicalName:
// "gpu-<minor>-mig-<profile without dots, RFC 1123>-<GI profile id>-<placement
// start>"). The simulator's GPUs have minor number = index.
func draDeviceName(minor int, profile string, id, start int) string {
	p := notRFC1123.ReplaceAllString(strings.ToLower(strings.ReplaceAll(profile, ".", "")), "-")
	p = strings.TrimRight(strings.Trim(p, "-"), ".")
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", minor, p, id, start)
}

// draDevices enumerates the simulated GPUs as the driver does without
// DynamicMIG (nvlib.go enumerateAllPossibleDevices): a GPU with MIG off is
// one device "gpu-<minor>"; a GPU with MIG on is its MIG devices only.
func draDevices(t testing.TB, o *Opts) []kubetest.NVIDIADevice {
	t.Helper()
	out, errOut, code := RunCLI(t, "profiles", "-o", "json", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState, "--log-level", "error")
	if code != 0 {
		t.Fatalf("profiles: exit %d: %s", code, errOut)
	}
	var doc struct{ GPUs []draGPU }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	var devs []kubetest.NVIDIADevice
	for _, g := range doc.GPUs {
		if !g.MigMode.Current {
			devs = append(devs, kubetest.NVIDIADevice{Name: fmt.Sprintf("gpu-%d", g.Index), UUID: g.UUID})
			continue
		}
		for _, in := range g.Instances {
			id := -1
			for _, p := range g.Profiles {
				if p.Name == in.Profile {
					id = p.ID
				}
			}
			devs = append(devs, kubetest.NVIDIADevice{Name: draDeviceName(g.Index, in.Profile, id, in.Start),
				UUID: in.UUID, ParentUUID: g.UUID, Profile: in.Profile})
		}
	}
	// The attributes and capacities, read through NVML as the plugin does.
	lib, err := nvmlsim.NewSimNVML(o.Sim, nvmlsim.Options{StatePath: o.SimState})
	if err != nil {
		t.Fatal(err)
	}
	if err := nvidiadra.Details(lib, devs); err != nil {
		t.Fatal(err)
	}
	return devs
}

// announced lists "name=uuid" of the NVIDIA DRA devices in the node's slices.
func announced(t testing.TB, c kubernetes.Interface, node string) []string {
	t.Helper()
	sl, err := dra.NodeSlices(context.Background(), clientset.Wrap(c), node)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range sl {
		for _, d := range s.Devices {
			out = append(out, d.Name+"="+d.UUID)
		}
	}
	slices.Sort(out)
	return out
}

func names(devs []kubetest.NVIDIADevice) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Name+"="+d.UUID)
	}
	slices.Sort(out)
	return out
}

// On the DRA path, with pre-created MIG devices: the NVIDIA DRA driver's
// kubelet plugin (stand-in publishing through the driver's library)
// announces the MIG devices; pods hold some through ResourceClaims. One
// label change: only the pod whose claimed device goes is evicted, the
// plugin is restarted once, and the slices announce exactly the new
// devices; the record says the node is served by the DRA driver.
func TestDRAChangeEvictsOnlyClaimsThatGo(t *testing.T) {
	c := kubetest.Client(t)
	ctx := context.Background()
	node := kubetest.NewName(t, "node")
	kubetest.CreateNode(t, node, nil)
	drv, work := kubetest.NewName(t, "dra"), kubetest.NewName(t, "ml")
	kubetest.CreateNamespace(t, drv)
	kubetest.CreateNamespace(t, work)
	kl := kubetest.StartKubelet(t, c, node)
	cfg := disConfig(t, `version: v1
mig-configs:
  before:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
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
	dp := kubetest.StartDRAPlugin(t, c, node, drv, func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
	WaitFor(t, 60*time.Second, "the DRA plugin to publish", func() bool { return dp.Counted() && len(announced(t, c, node)) == 2 })

	StartAgent(t, o)
	SelectConfig(t, c, node, "before")
	rec := WaitState(t, c, node, record.StateSuccess, "before", 90*time.Second)
	if rec.ServedBy != record.ServedByDRA {
		t.Errorf("servedBy = %q, want dra", rec.ServedBy)
	}
	before := draDevices(t, o)
	if got := announced(t, c, node); !slices.Equal(got, names(before)) || len(before) != 14 {
		t.Fatalf("slices announce %v, want %v", got, names(before))
	}

	// Claims, allocated as the scheduler does, prepared by the kubelet:
	// one on GPU 0 (stays), one on GPU 1 (goes).
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "trainer", UID: "0b7c1a52-0000-4000-8000-000000000002", Controller: ptr.To(true)}
	claimPod := func(name string, dev kubetest.NVIDIADevice) *corev1.Pod {
		pod := kl.CreatePod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: work, Name: name, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "mig", ResourceClaimName: ptr.To(name + "-mig")}},
				Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "mig"}}}}},
			}})
		kubetest.AllocateClaim(t, c, work, name+"-mig", "mig.nvidia.com", pod,
			kubetest.AllocatedDevice{Driver: dra.NVIDIADRADriver, Pool: node, Device: dev.Name})
		kl.PrepareClaims(t, pod)
		return pod
	}
	var on0, on1 kubetest.NVIDIADevice
	for _, d := range before {
		if strings.HasPrefix(d.Name, "gpu-0-mig-1g18gb-19-") && on0.Name == "" {
			on0 = d
		}
		if strings.HasPrefix(d.Name, "gpu-1-mig-1g18gb-19-") && on1.Name == "" {
			on1 = d
		}
	}
	stays := claimPod("stays", on0)
	claimPod("goes", on1)

	// The dry run names the claim-holding pod the change would evict.
	out, errOut, code := RunCLI(t, "plan", "-f", cfg, "-c", "after", "--nvml", "sim:"+o.Sim, "--sim-state", o.SimState,
		"--node-name", node, "--kubeconfig", o.Kubeconfig, "--pod-resources-socket", kl.Socket(), "--log-level", "error", "-o", "json")
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	for _, gp := range decodePlan(t, out).GPUs {
		var want []string
		if gp.Index == 1 {
			want = []string{work + "/goes"}
		}
		if !slices.Equal(gp.Evict, want) {
			t.Errorf("plan: GPU %d would evict %v, want %v", gp.Index, gp.Evict, want)
		}
	}

	SelectConfig(t, c, node, "after")
	rec = WaitState(t, c, node, record.StateSuccess, "after", 90*time.Second)
	if !slices.Equal(rec.EvictedPods, []string{work + "/goes"}) || rec.AffectedBy != record.AffectedByPodResources || rec.ServedBy != record.ServedByDRA {
		t.Errorf("record evictedPods %v affectedBy %q servedBy %q; want only %s/goes by pod-resources, dra", rec.EvictedPods, rec.AffectedBy, rec.ServedBy, work)
	}
	if p, err := c.CoreV1().Pods(work).Get(ctx, "stays", metav1.GetOptions{}); err != nil || p.UID != stays.UID || p.DeletionTimestamp != nil {
		t.Errorf("the pod on a MIG device that stays: %v, %v", p, err)
	}
	if _, err := c.CoreV1().Pods(work).Get(ctx, "goes", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod on a MIG device that went: %v", err)
	}
	// Started for MIG off, restarted after "before", once more after "after".
	if got := dp.Starts(); got != 3 {
		t.Errorf("DRA plugin started %d times, want 3 (once per change)", got)
	}
	after := draDevices(t, o)
	if got := announced(t, c, node); !slices.Equal(got, names(after)) || len(after) != 9 {
		t.Errorf("slices announce %v, want exactly %v", got, names(after))
	}
}

// A node served by the device plugin and the DRA driver at once is refused
// before anything is touched (MigAllocationPathConflict); on the DRA path,
// slices that never announce the new devices (the plugin not restarted)
// fail the change with MigResourcesTimeout, naming the ResourceSlices.
func TestDRAPathRefusals(t *testing.T) {
	c := kubetest.Client(t)
	start := func(t *testing.T, extra ...string) (string, *Opts) {
		node := kubetest.NewName(t, "node")
		kubetest.CreateNode(t, node, map[string]string{"nvidia.com/mig.strategy": "mixed"})
		drv := kubetest.NewName(t, "dra")
		kubetest.CreateNamespace(t, drv)
		o := (&Opts{Node: node, Sim: "h200x2", Extra: append(extra, "--operand-namespace", drv)}).Fill(t)
		dp := kubetest.StartDRAPlugin(t, c, node, drv, func() ([]kubetest.NVIDIADevice, error) { return draDevices(t, o), nil })
		WaitFor(t, 60*time.Second, "the DRA plugin to publish", func() bool { return dp.Counted() && len(announced(t, c, node)) == 2 })
		return node, o
	}
	t.Run("both paths", func(t *testing.T) {
		node, o := start(t)
		gpuop := kubetest.NewName(t, "gpu-operator")
		kubetest.CreateNamespace(t, gpuop)
		o.Extra = append(o.Extra, "--operand-namespace", gpuop)
		dp := kubetest.StartDevicePlugin(t, c, node, gpuop, "mixed", pluginReader(t, o))
		WaitFor(t, 60*time.Second, "the device plugin to advertise", func() bool { return dp.Counted() && allocatable(t, c, node)["nvidia.com/gpu"] == 2 })
		before := flReadSim(t, o.SimState)
		StartAgent(t, o)
		SelectConfig(t, c, node, "all-1g.18gb")
		flExpectFailed(t, c, node, "all-1g.18gb", o.SimState, before, "served by both the device plugin and the NVIDIA DRA driver")
		if len(eventuallyNodeEvents(t, c, node, record.ReasonAllocationPathConflict)) == 0 {
			t.Errorf("no %s Event", record.ReasonAllocationPathConflict)
		}
	})
	t.Run("slices never converge", func(t *testing.T) {
		node, o := start(t, "--restart-device-plugin=false", "--resource-wait-timeout", "3s")
		StartAgent(t, o)
		SelectConfig(t, c, node, "all-1g.18gb")
		rec := WaitState(t, c, node, record.StateFailed, "all-1g.18gb", 60*time.Second)
		if !strings.Contains(rec.Reason, "gpu.nvidia.com ResourceSlices did not announce exactly its devices") || rec.ServedBy != record.ServedByDRA {
			t.Errorf("record reason %q servedBy %q", rec.Reason, rec.ServedBy)
		}
		WaitFor(t, 10*time.Second, "a MigResourcesTimeout Event", func() bool {
			return len(nodeEvents(t, c, node, record.ReasonResourcesTimeout)) > 0
		})
	})
}
