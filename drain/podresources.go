package drain

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

const (
	// DefaultPodResourcesSocket is where the kubelet serves PodResources.
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// PodResourcesTimeout bounds one List call when ctx has no earlier deadline.
	PodResourcesTimeout = 10 * time.Second
	// podResourcesMaxMsg is the kubelet's own client limit (16 MiB).
	podResourcesMaxMsg = 16 << 20
	// GPUResourcePrefix starts every resource NVIDIA's device plugin advertises.
	GPUResourcePrefix = "nvidia.com/"
)

// ErrPodResources is wrapped by every ListPodResources error.
var ErrPodResources = errors.New("cannot read the kubelet PodResources API")

// PodDevices is one pod's devices as the kubelet PodResources API reports them.
type PodDevices struct {
	Namespace  string
	Name       string
	Containers []ContainerDevices
}

// ContainerDevices is one container's devices: resource name → device ids
// (device plugins), and the devices of its ResourceClaims (DRA).
type ContainerDevices struct {
	Name    string
	Devices map[string][]string
	// Claims are the devices of the container's ResourceClaims, from
	// PodResources dynamic_resources (every driver).
	Claims []ClaimDevice
}

// Key is "namespace/name".
func (p PodDevices) Key() string { return p.Namespace + "/" + p.Name }

// GPUDeviceIDs returns the ids of the devices the pod holds under nvidia.com/
// resources, normalized (see NormalizeDeviceID), sorted and without repeats.
func (p PodDevices) GPUDeviceIDs() []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range p.Containers {
		for res, ids := range c.Devices {
			if !strings.HasPrefix(res, GPUResourcePrefix) {
				continue
			}
			for _, id := range ids {
				id = NormalizeDeviceID(id)
				if !seen[id] {
					seen[id] = true
					out = append(out, id)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// NormalizeDeviceID strips the replica suffix that NVIDIA's device plugin
// appends to shared devices (time-slicing, MPS: "GPU-<uuid>::3"), leaving the
// GPU or MIG device UUID.
func NormalizeDeviceID(id string) string {
	if i := strings.Index(id, "::"); i >= 0 {
		return id[:i]
	}
	return id
}

// ListPodResources lists every pod's devices over the kubelet PodResources
// v1 gRPC API at socket (a unix socket path). Each call dials afresh and is
// bounded by PodResourcesTimeout.
func ListPodResources(ctx context.Context, socket string) ([]PodDevices, error) {
	if socket == "" {
		return nil, fmt.Errorf("%w: no socket configured", ErrPodResources)
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("%w: socket %s: %w", ErrPodResources, socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, PodResourcesTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(podResourcesMaxMsg)))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrPodResources, abs, err)
	}
	defer conn.Close()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("%w: List at %s: %w", ErrPodResources, abs, err)
	}
	out := make([]PodDevices, 0, len(resp.GetPodResources()))
	for _, p := range resp.GetPodResources() {
		pd := PodDevices{Namespace: p.GetNamespace(), Name: p.GetName()}
		for _, c := range p.GetContainers() {
			cd := ContainerDevices{Name: c.GetName(), Devices: map[string][]string{}}
			for _, d := range c.GetDevices() {
				cd.Devices[d.GetResourceName()] = append(cd.Devices[d.GetResourceName()], d.GetDeviceIds()...)
			}
			cd.Claims = claimDevicesOf(c.GetDynamicResources())
			pd.Containers = append(pd.Containers, cd)
		}
		out = append(out, pd)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, nil
}

// claimDevicesOf reads PodResources dynamic_resources (ContainerResources
// field 5: per claim, claim_resources with driver_name, pool_name,
// device_name), as the kubelet fills it from what the DRA driver prepared
// (kubernetes pkg/kubelet/cm/container_manager_linux.go GetDynamicResources).
func claimDevicesOf(drs []*podresourcesv1.DynamicResource) []ClaimDevice {
	var out []ClaimDevice
	for _, dr := range drs {
		for _, r := range dr.GetClaimResources() {
			out = append(out, ClaimDevice{Driver: r.GetDriverName(), Pool: r.GetPoolName(), Device: r.GetDeviceName()})
		}
	}
	return out
}

// NVIDIAClaimDevices returns the devices the pod holds through claims on
// the NVIDIA DRA driver, without repeats, in order.
func (p PodDevices) NVIDIAClaimDevices() []ClaimDevice {
	seen := map[ClaimDevice]bool{}
	var out []ClaimDevice
	for _, c := range p.Containers {
		for _, d := range c.Claims {
			if d.Driver == NVIDIADRADriver && !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}
