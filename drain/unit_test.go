package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/testkit/clientset"
)

func TestNormalizeDeviceID(t *testing.T) {
	for in, want := range map[string]string{
		"GPU-1f2e":       "GPU-1f2e",
		"GPU-1f2e::0":    "GPU-1f2e",
		"MIG-9a9a::12":   "MIG-9a9a",
		"":               "",
		"3":              "3",
		"MIG-aa::1::bad": "MIG-aa",
	} {
		if got := podresources.NormalizeDeviceID(in); got != want {
			t.Errorf("NormalizeDeviceID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHolders(t *testing.T) {
	pods := []podresources.Pod{
		{Namespace: "a", Name: "whole", Containers: []podresources.Container{
			{Name: "c", Devices: map[string][]string{"nvidia.com/gpu": {"GPU-1"}}},
		}},
		{Namespace: "a", Name: "shared", Containers: []podresources.Container{
			{Name: "c", Devices: map[string][]string{"nvidia.com/gpu.shared": {"GPU-2::3"}}},
		}},
		{Namespace: "b", Name: "mig", Containers: []podresources.Container{
			{Name: "init", Devices: map[string][]string{"nvidia.com/mig-1g.18gb": {"MIG-a"}}},
			{Name: "c", Devices: map[string][]string{"nvidia.com/mig-3g.71gb": {"MIG-b"}}},
		}},
		{Namespace: "b", Name: "other-vendor", Containers: []podresources.Container{
			{Name: "c", Devices: map[string][]string{"example.com/gpu": {"GPU-1"}}},
		}},
		{Namespace: "b", Name: "cpu-only"},
		// Claims on the NVIDIA DRA driver, as PodResources dynamic_resources
		// names them (device names of dra-driver-nvidia-gpu deviceinfo.go,
		// mig.go ToCanonicalName).
		{Namespace: "c", Name: "claim-mig", Containers: []podresources.Container{
			{Name: "c", Claims: []dra.ClaimDevice{{Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-0-mig-1g18gb-19-0"}}},
		}},
		{Namespace: "c", Name: "claim-gpu", Containers: []podresources.Container{
			{Name: "a", Claims: []dra.ClaimDevice{{Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-1"}}},
			{Name: "b", Claims: []dra.ClaimDevice{{Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-1"}}}, // one claim, two containers
		}},
		{Namespace: "c", Name: "claim-unknown", Containers: []podresources.Container{
			{Name: "c", Claims: []dra.ClaimDevice{{Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-0-mig-1g18gb-19-1"}}},
		}},
		{Namespace: "c", Name: "claim-other-driver", Containers: []podresources.Container{
			{Name: "c", Claims: []dra.ClaimDevice{{Driver: "example.com/gpu", Pool: "n1", Device: "gpu-0-mig-1g18gb-19-0"}}},
		}},
	}
	idx := draIndex{UUIDs: map[dra.ClaimDevice]string{
		{Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-0-mig-1g18gb-19-0"}: "MIG-c",
		{Driver: dra.NVIDIADRADriver, Pool: "n1", Device: "gpu-1"}:                 "GPU-1",
	}}
	// A claimed device the node's slices do not resolve counts as taken away.
	unknown := map[string][]string{"c/claim-unknown": {"gpu.nvidia.com/n1/gpu-0-mig-1g18gb-19-1"}}
	with := func(m map[string][]string) map[string][]string {
		out := maps.Clone(m)
		maps.Copy(out, unknown)
		return out
	}
	tests := []struct {
		name   string
		change deviceChange
		want   map[string][]string
	}{
		{"nothing", deviceChange{}, with(map[string][]string{})},
		{"one whole GPU", deviceChange{GPUs: []string{"GPU-1"}}, with(map[string][]string{"a/whole": {"GPU-1"}, "c/claim-gpu": {"GPU-1"}})},
		{"shared replica", deviceChange{GPUs: []string{"GPU-2"}}, with(map[string][]string{"a/shared": {"GPU-2"}})},
		{"MIG device of an init container", deviceChange{MIGDevices: []string{"MIG-a"}}, with(map[string][]string{"b/mig": {"MIG-a"}})},
		{"MIG device kept", deviceChange{MIGDevices: []string{"MIG-zzz"}}, with(map[string][]string{})},
		{"claimed MIG device taken", deviceChange{MIGDevices: []string{"MIG-c"}}, with(map[string][]string{"c/claim-mig": {"MIG-c"}})},
		// The GPU of a claimed MIG device changes, the MIG device stays.
		{"claimed MIG device kept on a changing GPU", deviceChange{GPUs: []string{"GPU-0"}}, with(map[string][]string{})},
		{"both", deviceChange{GPUs: []string{"GPU-1", "GPU-9"}, MIGDevices: []string{"MIG-b", "MIG-a"}},
			with(map[string][]string{"a/whole": {"GPU-1"}, "b/mig": {"MIG-a", "MIG-b"}, "c/claim-gpu": {"GPU-1"}})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := deviceHolders(pods, tc.change, idx)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Holders = %v, want %v", got, tc.want)
			}
		})
	}
}

// testGPU is one GPU in TestExpectedResources: its MIG mode, and the
// profiles of its MIG devices.
type testGPU struct {
	migOn    bool
	profiles []string
}

// exposedBy is gs as WaitResources takes them, the GPUs and MIG devices
// named by their position.
func exposedBy(gs []testGPU) (map[string]bool, map[string]string) {
	migMode, migDevices := map[string]bool{}, map[string]string{}
	for i, g := range gs {
		migMode[fmt.Sprintf("GPU-%d", i)] = g.migOn
		for j, p := range g.profiles {
			migDevices[fmt.Sprintf("MIG-%d-%d", i, j)] = p
		}
	}
	return migMode, migDevices
}

func TestExpectedResources(t *testing.T) {
	mig := func(devs ...string) testGPU { return testGPU{migOn: true, profiles: devs} }
	whole := testGPU{}
	tests := []struct {
		name     string
		strategy string
		gpus     []testGPU
		want     map[corev1.ResourceName]int64
		err      error
	}{
		{"mixed, all balanced", profiles.StrategyMixed,
			[]testGPU{mig("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"), mig("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb")},
			map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb": 4, "nvidia.com/mig-2g.35gb": 2, "nvidia.com/mig-3g.71gb": 2}, nil},
		{"mixed with a whole GPU", profiles.StrategyMixed, []testGPU{mig("7g.141gb"), whole, whole},
			map[corev1.ResourceName]int64{"nvidia.com/mig-7g.141gb": 1, "nvidia.com/gpu": 2}, nil},
		{"mixed, +me and compute instance", profiles.StrategyMixed, []testGPU{mig("1g.18gb+me", "1c.3g.71gb", "1c.3g.71gb")},
			map[corev1.ResourceName]int64{"nvidia.com/mig-1g.18gb.me": 1, "nvidia.com/mig-1c.3g.71gb": 2}, nil},
		{"mixed, MIG on without devices", profiles.StrategyMixed, []testGPU{mig()}, map[corev1.ResourceName]int64{}, nil},
		{"single", profiles.StrategySingle, []testGPU{mig("1g.18gb", "1g.18gb", "1g.18gb"), mig("1g.18gb"), whole},
			map[corev1.ResourceName]int64{"nvidia.com/gpu": 5}, nil},
		{"none counts GPUs", profiles.StrategyNone, []testGPU{mig("1g.18gb", "1g.18gb"), whole},
			map[corev1.ResourceName]int64{"nvidia.com/gpu": 2}, nil},
		{"empty strategy is none", "", []testGPU{whole},
			map[corev1.ResourceName]int64{"nvidia.com/gpu": 1}, nil},
		{"no GPUs", profiles.StrategyMixed, nil, map[corev1.ResourceName]int64{}, nil},
		{"unknown strategy", "Mixed", []testGPU{whole}, nil, errUnknownStrategy},
		{"bad profile", profiles.StrategyMixed, []testGPU{mig("1g.18")}, nil, profiles.ErrBadName},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			migMode, migDevices := exposedBy(tc.gpus)
			got, err := expectedResources(tc.strategy, migMode, migDevices)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("ExpectedResources = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSavedJSONAndPaused(t *testing.T) {
	s := savedLabels{
		"nvidia.com/gpu.deploy.device-plugin": ptr.To("true"),
		"nvidia.com/gpu.deploy.dcgm":          ptr.To("false"),
		"nvidia.com/gpu.deploy.nvsm":          nil,
		"nvidia.com/gpu.deploy.dcgm-exporter": ptr.To("custom"),
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"nvidia.com/gpu.deploy.nvsm":null`) {
		t.Errorf("absent label not kept as null: %s", b)
	}
	var back savedLabels
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, s) {
		t.Errorf("round trip: %v, want %v", back, s)
	}
	want := []string{"nvidia.com/gpu.deploy.dcgm-exporter", "nvidia.com/gpu.deploy.device-plugin"}
	if got := back.Paused(); !slices.Equal(got, want) {
		t.Errorf("Paused = %v, want %v", got, want)
	}
}

func TestRefuse(t *testing.T) {
	owned := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u", Controller: ptr.To(true)}
	pod := func(name string, mirror bool, owner *metav1.OwnerReference) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if mirror {
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
		}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	tests := []struct {
		name    string
		pods    []corev1.Pod
		opts    evictOptions
		wantErr []string // substrings; none means no error
	}{
		{"managed", []corev1.Pod{pod("a", false, &owned)}, evictOptions{RefuseUnmanaged: true}, nil},
		{"unmanaged evicted by default", []corev1.Pod{pod("a", false, nil)}, evictOptions{}, nil},
		{"unmanaged refused", []corev1.Pod{pod("a", false, &owned), pod("b", false, nil)}, evictOptions{RefuseUnmanaged: true},
			[]string{"no controller", "ns/b"}},
		{"static pod", []corev1.Pod{pod("s", true, nil)}, evictOptions{}, []string{"static pods", "ns/s"}},
	}
	for _, tc := range tests {
		err := refuse(tc.pods, tc.opts)
		if len(tc.wantErr) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, errNotEvictable) {
			t.Errorf("%s: err = %v, want ErrNotEvictable", tc.name, err)
			continue
		}
		for _, s := range tc.wantErr {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", tc.name, err, s)
			}
		}
	}
}

// The allocatable wait follows a watch of the Node: one list, one watch, no
// reads while the kubelet publishes nothing new; the update that shows the
// resources ends it.
func TestWaitAllocatableWatches(t *testing.T) {
	mig := corev1.ResourceName("nvidia.com/mig-1g.18gb")
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Allocatable: corev1.ResourceList{resourceGPU: resource.MustParse("1"), mig: resource.MustParse("0")}}}
	c := fake.NewClientset(n)
	done := make(chan error, 1)
	go func() {
		ok, err := waitAllocatable(context.Background(), clientset.Wrap(c), "n1", map[corev1.ResourceName]int64{mig: 7}, 30*time.Second)
		if err == nil && !ok {
			err = errors.New("not ok")
		}
		done <- err
	}()
	verbs := func() []string {
		var out []string
		for _, a := range c.Actions() {
			out = append(out, a.GetVerb())
		}
		return out
	}
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(verbs(), "watch"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no watch; requests %v", verbs())
		}
	}
	time.Sleep(1200 * time.Millisecond) // a poll would have read the Node twice by now
	if got := verbs(); !slices.Equal(got, []string{"list", "watch"}) {
		t.Fatalf("requests while nothing changed: %v, want [list watch]", got)
	}
	n = n.DeepCopy()
	n.Status.Allocatable = corev1.ResourceList{resourceGPU: resource.MustParse("0"), mig: resource.MustParse("7")}
	if _, err := c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the update that shows the resources did not end the wait")
	}
}
