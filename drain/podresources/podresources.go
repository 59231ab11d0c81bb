// Package podresources reads the kubelet PodResources API: which pod holds
// which device, under a device plugin's resource or through a DRA claim. It
// makes its one unary gRPC call itself (grpcwire.go) and decodes the
// messages field by field (wire.go), without linking grpc-go.
package podresources

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/migagent/mig-agent/dra"
)

const (
	// podResourcesTimeout bounds one List call when ctx has no earlier deadline.
	podResourcesTimeout = 10 * time.Second
	// podResourcesMaxMsg is the kubelet's own client limit (16 MiB).
	podResourcesMaxMsg = 16 << 20
	// GPUResourcePrefix starts every resource NVIDIA's device plugin advertises
	// (and others' too: IsGPUResource tells them apart).
	GPUResourcePrefix = "nvidia.com/"
	// GPUResource and MIGResourcePrefix are the names of the device plugin's
	// whole GPUs and MIG devices.
	GPUResource       = GPUResourcePrefix + "gpu"
	MIGResourcePrefix = GPUResourcePrefix + "mig-"
	// SharedSuffix: a shared resource the plugin renames (renameByDefault)
	// is its name plus this (api/config/v1 DefaultSharedResourceNameSuffix).
	SharedSuffix = ".shared"
)

// IsGPUResource reports whether name is one NVIDIA's device plugin
// advertises for GPUs: nvidia.com/gpu or nvidia.com/mig-<profile>, shared
// under its own name or renamed with ".shared". Nothing else counts,
// though it shares the prefix: the Network Operator's nvidia.com/hostdev,
// nvidia.com/rdma_shared_device_*, SR-IOV pools (nvidia.com/cx7_vf). The
// plugin takes no other name: its config's custom resource names and
// sharing renames are switched off (api/config/v1
// DisableResourceNamingInConfig).
func IsGPUResource(name string) bool {
	name = strings.TrimSuffix(name, SharedSuffix)
	return name == GPUResource || strings.HasPrefix(name, MIGResourcePrefix) && len(name) > len(MIGResourcePrefix)
}

// ErrUnreadable is wrapped by every List error.
var ErrUnreadable = errors.New("cannot read the kubelet PodResources API")

// Pod is one pod's devices as the kubelet PodResources API reports them.
type Pod struct {
	Namespace  string
	Name       string
	Containers []Container
}

// Container is one container's devices: resource name → device ids
// (device plugins), and the DRA devices its claims gave it.
type Container struct {
	Name    string
	Devices map[string][]string
	// Dynamic is what DRA allocated to the container, one entry per claim
	// (ContainerResources.dynamic_resources).
	Dynamic []DynamicResource
	// Claims are the devices of Dynamic by driver, pool and device, the
	// key the node's ResourceSlices name them by (every driver).
	Claims []dra.ClaimDevice
}

// DynamicResource is one ResourceClaim's devices in one container
// (PodResources v1 DynamicResource).
type DynamicResource struct {
	ClaimName      string
	ClaimNamespace string
	Claims         []ClaimResource
}

// ClaimResource is one allocated DRA device (PodResources v1 ClaimResource):
// the driver/pool/device triplet names it.
type ClaimResource struct {
	CDIDevices []string
	Driver     string
	Pool       string
	Device     string
	// ShareID is set when the device is shared (consumable capacity).
	ShareID string
}

// Key is "namespace/name".
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// GPUDeviceIDs returns the ids of the devices the pod holds under the device
// plugin's GPU resources (IsGPUResource), normalized (see NormalizeDeviceID), sorted and without repeats.
func (p Pod) GPUDeviceIDs() []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range p.Containers {
		for res, ids := range c.Devices {
			if !IsGPUResource(res) {
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

// List lists every pod's devices over the kubelet PodResources
// v1 API at socket (a unix socket path): one unary gRPC call,
// /v1.PodResourcesLister/List, made over HTTP/2 without TLS (grpcwire.go).
// Each call dials afresh and is bounded by podResourcesTimeout.
func List(ctx context.Context, socket string) ([]Pod, error) {
	if socket == "" {
		return nil, fmt.Errorf("%w: no socket configured", ErrUnreadable)
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("%w: socket %s: %w", ErrUnreadable, socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	msg, err := unaryCall(ctx, abs, podResourcesListMethod, nil, podResourcesMaxMsg)
	if err != nil {
		return nil, fmt.Errorf("%w: List at %s: %w", ErrUnreadable, abs, err)
	}
	out, err := decodeListPodResources(msg)
	if err != nil {
		return nil, fmt.Errorf("%w: List at %s: %w", ErrUnreadable, abs, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, nil
}

// claimDevicesOf reads PodResources dynamic_resources (ContainerResources
// field 5: per claim, claim_resources with driver_name, pool_name,
// device_name), as the kubelet fills it from what the DRA driver prepared
// (kubernetes pkg/kubelet/cm/container_manager_linux.go GetDynamicResources).
func claimDevicesOf(drs []DynamicResource) []dra.ClaimDevice {
	var out []dra.ClaimDevice
	for _, dr := range drs {
		for _, r := range dr.Claims {
			out = append(out, dra.ClaimDevice{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
		}
	}
	return out
}

// NVIDIAClaimDevices returns the devices the pod holds through claims on
// the NVIDIA DRA driver, without repeats, in order.
func (p Pod) NVIDIAClaimDevices() []dra.ClaimDevice {
	seen := map[dra.ClaimDevice]bool{}
	var out []dra.ClaimDevice
	for _, c := range p.Containers {
		for _, d := range c.Claims {
			if d.Driver == dra.NVIDIADRADriver && !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}
