package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/readonce"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// The Dynamic Resource Allocation side of a node, read the same way from
// whichever version of resource.k8s.io the API server serves: v1 (on by
// default since Kubernetes 1.34), else v1beta2, else v1beta1 (both off by
// default in 1.37, on in older clusters). Each version has one converter to
// the small shapes below; one loop asks the versions in that order.

// NVIDIADRADriver is the NVIDIA DRA driver's name (spec.driver of its
// ResourceSlices, driver_name in PodResources, driver of a claim's
// allocation): DriverName in dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/main.go.
const NVIDIADRADriver = "gpu.nvidia.com"

// The NVIDIA DRA driver's device attributes (its own domain, unqualified in
// the slice): GpuInfo.Attributes and MigDeviceInfo.GetDevice in
// dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go.
const (
	// draAttrType is "gpu", "mig" or "vfio" (types.go GpuDeviceType,
	// MigStaticDeviceType; DynamicMIG devices are "mig" too).
	draAttrType = "type"
	// draAttrUUID is the device's "GPU-…" or "MIG-…" UUID (absent on
	// DynamicMIG devices, which do not exist until allocated).
	draAttrUUID = "uuid"
	// draAttrParentUUID is a MIG device's GPU UUID.
	draAttrParentUUID = "parentUUID"
)

// Device types of the NVIDIA DRA driver's "type" attribute.
const (
	DRATypeGPU = "gpu"
	DRATypeMIG = "mig"
)

// ErrNoDRA: the API server serves no version of resource.k8s.io that the
// agent reads (v1, v1beta2, v1beta1): a cluster without DRA.
// errNoNode: a node name is needed to list its ResourceSlices.
var errNoNode = errors.New("no node name")

// ErrNoDRA: the API server serves no DRA version.
var ErrNoDRA = errors.New("the API server serves no resource.k8s.io version (v1, v1beta2, v1beta1)")

// Slice is one ResourceSlice as far as the agent reads it.
type Slice struct {
	Name   string
	Driver string
	Pool   string
	// Version is the resource.k8s.io version it was read through.
	Version string
	// CounterSets counts spec.sharedCounters (KEP-4815 partitionable
	// devices: what the driver's DynamicMIG mode publishes).
	CounterSets int
	Devices     []SliceDevice
}

// SliceDevice is one device of a Slice.
type SliceDevice struct {
	Name       string
	Type       string // the driver's "type" attribute
	UUID       string // the driver's "uuid" attribute
	ParentUUID string // the driver's "parentUUID" attribute (MIG devices)
	// ConsumesCounters: the device draws on the slice's shared counters
	// (DynamicMIG: a MIG device that is created only when allocated).
	ConsumesCounters bool
}

// Claim is one ResourceClaim's allocation and who holds it.
type Claim struct {
	Namespace, Name string
	// Devices are status.allocation.devices.results.
	Devices []ClaimDevice
	// Pods are the pods of status.reservedFor (by name, in Namespace).
	Pods []string
	// Allocated: status.allocation is set.
	Allocated bool
	// Requests are spec.devices.requests that ask for exactly some devices
	// (v1 and v1beta2: exactly; v1beta1: the request itself), in order.
	Requests []ClaimRequest
}

// ClaimRequest is one request of a claim for devices of one class.
type ClaimRequest struct {
	// Class is the request's deviceClassName.
	Class string
	// All: allocationMode All (every matching device) rather than a count.
	All bool
	// Count is the request's count (0 when unset: one).
	Count int64
	// Selectors are the CEL expressions of its selectors.
	Selectors []string
}

// ClaimDevice is one allocated device: driver, pool and device name, as a
// claim's allocation and PodResources' dynamic_resources both name it.
type ClaimDevice struct {
	Driver, Pool, Device string
}

// String is "driver/pool/device".
func (d ClaimDevice) String() string { return d.Driver + "/" + d.Pool + "/" + d.Device }

// versioned lists T through one version of resource.k8s.io.
type versioned[T any] struct {
	version string
	list    func(ctx context.Context, opts metav1.ListOptions) ([]T, error)
}

// listServed lists through the first version the API server serves: a 404
// moves to the next version; every other error (403 included: callers tell
// "not allowed" by apierrors.IsForbidden) ends the search. ErrNoDRA when
// none is served.
func listServed[T any](ctx context.Context, what string, opts metav1.ListOptions, versions []versioned[T]) ([]T, error) {
	for _, v := range versions {
		items, err := v.list(ctx, opts)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s (resource.k8s.io/%s): %w", what, v.version, err)
		}
		return items, nil
	}
	return nil, fmt.Errorf("listing %s: %w", what, ErrNoDRA)
}

// NodeSlices lists the ResourceSlices of node (spec.nodeName), of every
// driver, sorted by name. ErrNoDRA when the cluster has no DRA API; a
// forbidden list is returned as such (apierrors.IsForbidden).
//
// Within a readonce memo (readonce.With) the list is read once and shared:
// callers must not modify it.
func NodeSlices(ctx context.Context, client kclient.Interface, node string) ([]Slice, error) {
	if node == "" {
		return nil, fmt.Errorf("list ResourceSlices: %w", errNoNode)
	}
	return readonce.Do(ctx, "resourceslices/"+node, func(ctx context.Context) ([]Slice, error) {
		return nodeSlices(ctx, client, node)
	})
}

func nodeSlices(ctx context.Context, client kclient.Interface, node string) ([]Slice, error) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()}
	out, err := listServed(ctx, "ResourceSlices", opts, []versioned[Slice]{
		{"v1", func(ctx context.Context, o metav1.ListOptions) ([]Slice, error) {
			l, err := client.ResourceV1().ResourceSlices().List(ctx, o)
			return convert(l, err, func(l *resourcev1.ResourceSliceList) []resourcev1.ResourceSlice { return l.Items }, sliceV1)
		}},
		{"v1beta2", func(ctx context.Context, o metav1.ListOptions) ([]Slice, error) {
			l, err := client.ResourceV1beta2().ResourceSlices().List(ctx, o)
			return convert(l, err, func(l *resourcev1beta2.ResourceSliceList) []resourcev1beta2.ResourceSlice { return l.Items }, sliceV1beta2)
		}},
		{"v1beta1", func(ctx context.Context, o metav1.ListOptions) ([]Slice, error) {
			l, err := client.ResourceV1beta1().ResourceSlices().List(ctx, o)
			return convert(l, err, func(l *resourcev1beta1.ResourceSliceList) []resourcev1beta1.ResourceSlice { return l.Items }, sliceV1beta1)
		}},
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// Claims lists the ResourceClaims of every namespace.
func Claims(ctx context.Context, client kclient.Interface) ([]Claim, error) {
	return ClaimsIn(ctx, client, metav1.NamespaceAll)
}

// ClaimsIn lists the ResourceClaims of namespace (metav1.NamespaceAll:
// every namespace), through the first version the API server serves.
// ErrNoDRA when it serves none.
func ClaimsIn(ctx context.Context, client kclient.Interface, namespace string) ([]Claim, error) {
	return listServed(ctx, "ResourceClaims", metav1.ListOptions{}, []versioned[Claim]{
		{"v1", func(ctx context.Context, o metav1.ListOptions) ([]Claim, error) {
			l, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, o)
			return convert(l, err, func(l *resourcev1.ResourceClaimList) []resourcev1.ResourceClaim { return l.Items }, claimV1)
		}},
		{"v1beta2", func(ctx context.Context, o metav1.ListOptions) ([]Claim, error) {
			l, err := client.ResourceV1beta2().ResourceClaims(namespace).List(ctx, o)
			return convert(l, err, func(l *resourcev1beta2.ResourceClaimList) []resourcev1beta2.ResourceClaim { return l.Items }, claimV1beta2)
		}},
		{"v1beta1", func(ctx context.Context, o metav1.ListOptions) ([]Claim, error) {
			l, err := client.ResourceV1beta1().ResourceClaims(namespace).List(ctx, o)
			return convert(l, err, func(l *resourcev1beta1.ResourceClaimList) []resourcev1beta1.ResourceClaim { return l.Items }, claimV1beta1)
		}},
	})
}

// convert maps a typed list's items through one version's converter.
func convert[L any, I any, T any](l L, err error, items func(L) []I, one func(*I) T) ([]T, error) {
	if err != nil {
		return nil, err
	}
	in := items(l)
	out := make([]T, 0, len(in))
	for i := range in {
		out = append(out, one(&in[i]))
	}
	return out, nil
}

func sliceV1(s *resourcev1.ResourceSlice) Slice {
	out := Slice{Name: s.Name, Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Version: "v1", CounterSets: len(s.Spec.SharedCounters)}
	for _, d := range s.Spec.Devices {
		str := func(k string) string { return deref(d.Attributes[resourcev1.QualifiedName(k)].StringValue) }
		out.Devices = append(out.Devices, SliceDevice{Name: d.Name, Type: str(draAttrType), UUID: str(draAttrUUID),
			ParentUUID: str(draAttrParentUUID), ConsumesCounters: len(d.ConsumesCounters) > 0})
	}
	return out
}

// sliceV1beta2: v1beta2 has v1's shape (v1 is v1beta2 promoted
// unchanged, KEP-4381), so a v1beta2 object reads as v1 through its JSON.
func sliceV1beta2(s *resourcev1beta2.ResourceSlice) Slice {
	out := sliceV1(sameShape[resourcev1.ResourceSlice](s))
	out.Version = "v1beta2"
	return out
}

// sameShape decodes in's JSON as an Out: a v1beta2 object as its v1 twin.
// The two share every field name and type, so neither step fails; should
// one ever, Out stays as far as it was decoded.
func sameShape[Out any, In any](in *In) *Out {
	out := new(Out)
	if b, err := json.Marshal(in); err == nil {
		_ = json.Unmarshal(b, out)
	}
	return out
}

// sliceV1beta1: v1beta1 keeps a device's attributes and counters under
// "basic" (BasicDevice).
func sliceV1beta1(s *resourcev1beta1.ResourceSlice) Slice {
	out := Slice{Name: s.Name, Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Version: "v1beta1", CounterSets: len(s.Spec.SharedCounters)}
	for _, d := range s.Spec.Devices {
		var b resourcev1beta1.BasicDevice
		if d.Basic != nil {
			b = *d.Basic
		}
		str := func(k string) string { return deref(b.Attributes[resourcev1beta1.QualifiedName(k)].StringValue) }
		out.Devices = append(out.Devices, SliceDevice{Name: d.Name, Type: str(draAttrType), UUID: str(draAttrUUID),
			ParentUUID: str(draAttrParentUUID), ConsumesCounters: len(b.ConsumesCounters) > 0})
	}
	return out
}

func claimV1(c *resourcev1.ResourceClaim) Claim {
	out := Claim{Namespace: c.Namespace, Name: c.Name, Allocated: c.Status.Allocation != nil}
	for _, r := range c.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			req := ClaimRequest{Class: e.DeviceClassName, Count: e.Count,
				All: e.AllocationMode == resourcev1.DeviceAllocationModeAll}
			for _, sel := range e.Selectors {
				if sel.CEL != nil {
					req.Selectors = append(req.Selectors, sel.CEL.Expression)
				}
			}
			out.Requests = append(out.Requests, req)
		}
	}
	if a := c.Status.Allocation; a != nil {
		for _, r := range a.Devices.Results {
			out.Devices = append(out.Devices, ClaimDevice{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
		}
	}
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			out.Pods = append(out.Pods, r.Name)
		}
	}
	return out
}

// claimV1beta2 reads a v1beta2 claim as v1 (sliceV1beta2).
func claimV1beta2(c *resourcev1beta2.ResourceClaim) Claim {
	return claimV1(sameShape[resourcev1.ResourceClaim](c))
}

// claimV1beta1: a v1beta1 request names its class itself; one that
// names none lists alternatives (firstAvailable), as v1's without exactly.
func claimV1beta1(c *resourcev1beta1.ResourceClaim) Claim {
	out := Claim{Namespace: c.Namespace, Name: c.Name, Allocated: c.Status.Allocation != nil}
	for _, r := range c.Spec.Devices.Requests {
		if r.DeviceClassName != "" {
			req := ClaimRequest{Class: r.DeviceClassName, Count: r.Count,
				All: r.AllocationMode == resourcev1beta1.DeviceAllocationModeAll}
			for _, sel := range r.Selectors {
				if sel.CEL != nil {
					req.Selectors = append(req.Selectors, sel.CEL.Expression)
				}
			}
			out.Requests = append(out.Requests, req)
		}
	}
	if a := c.Status.Allocation; a != nil {
		for _, r := range a.Devices.Results {
			out.Devices = append(out.Devices, ClaimDevice{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
		}
	}
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			out.Pods = append(out.Pods, r.Name)
		}
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DRAUUIDs maps each NVIDIA DRA device of slices to its UUID, keyed by
// pool and device name (a claim's and PodResources' way to name it).
// Devices without a uuid attribute (DynamicMIG's) are left out.
func DRAUUIDs(slices []Slice) map[ClaimDevice]string {
	out := map[ClaimDevice]string{}
	for _, s := range slices {
		if s.Driver != NVIDIADRADriver {
			continue
		}
		for _, d := range s.Devices {
			if d.UUID != "" {
				out[ClaimDevice{Driver: s.Driver, Pool: s.Pool, Device: d.Name}] = d.UUID
			}
		}
	}
	return out
}

// AnnouncedUUIDs lists the UUIDs of the GPUs and MIG devices the NVIDIA DRA
// driver announces in slices (types gpu and mig), sorted.
func AnnouncedUUIDs(slices []Slice) []string {
	var out []string
	for _, s := range slices {
		if s.Driver != NVIDIADRADriver {
			continue
		}
		for _, d := range s.Devices {
			if (d.Type == DRATypeGPU || d.Type == DRATypeMIG) && d.UUID != "" {
				out = append(out, d.UUID)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Partitionable names the first NVIDIA DRA slice of slices that carries
// shared counters or a device consuming them (KEP-4815), the shape of the
// driver's DynamicMIG mode, which creates and destroys MIG devices itself
// (generateSplitResourceSlices / generateCombinedResourceSlices in
// dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/driver.go), or "".
// Pre-created MIG devices announced without counters are not.
func Partitionable(slices []Slice) string {
	for _, s := range slices {
		if s.Driver != NVIDIADRADriver {
			continue
		}
		if s.CounterSets > 0 {
			return fmt.Sprintf("ResourceSlice %s carries %d shared counter sets", s.Name, s.CounterSets)
		}
		for _, d := range s.Devices {
			if d.ConsumesCounters {
				return fmt.Sprintf("ResourceSlice %s: device %s consumes shared counters", s.Name, d.Name)
			}
		}
	}
	return ""
}

// ServesDevices reports whether the NVIDIA DRA driver announces any GPU or
// MIG device in slices.
func ServesDevices(slices []Slice) bool {
	for _, s := range slices {
		if s.Driver != NVIDIADRADriver {
			continue
		}
		for _, d := range s.Devices {
			if d.Type == DRATypeGPU || d.Type == DRATypeMIG {
				return true
			}
		}
	}
	return false
}
