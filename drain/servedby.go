package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/drain/fresh"
	"github.com/migagent/mig-agent/record"
)

// The DRA path: a node whose GPUs NVIDIA's DRA driver hands to pods
// (gpu.nvidia.com ResourceSlices) instead of the device plugin (nvidia.com/
// resources in the Node's allocatable). Without DynamicMIG the driver
// announces the MIG devices that exist when its kubelet plugin starts and
// never looks again (publishResources in dra-driver-nvidia-gpu
// cmd/gpu-kubelet-plugin/driver.go): after a change its pod is restarted
// (DevicePlugins lists it) and the change succeeds only when the slices
// announce exactly the new devices.

// draPollInterval is how often WaitResources reads the node's ResourceSlices
// on the DRA path.
const draPollInterval = time.Second

// ServedBy implements reconcile.Disruptor: the DRA path when the NVIDIA DRA
// driver announces GPUs or MIG devices of the node, the device plugin's when
// the Node's allocatable has one of the device plugin's GPU resources
// (nvidia.com/gpu, nvidia.com/mig-*, their .shared forms; not the Network
// Operator's nvidia.com/hostdev and the like); both at once is a
// conflict. No DRA API, or no right to read it, counts as no DRA.
func (d *Disruptor) ServedBy(ctx context.Context) (path, conflict string, err error) {
	read := d.ReadNode
	if read == nil {
		read = func(ctx context.Context) (*corev1.Node, error) {
			return d.Client.CoreV1().Nodes().Get(ctx, d.Node, metav1.GetOptions{})
		}
	}
	node, err := read(ctx)
	if err != nil {
		return "", "", fmt.Errorf("reading node %s: %w", d.Node, err)
	}
	dp := devicePluginResources(node)
	sl, err := dra.NodeSlices(ctx, d.Client, d.Node)
	switch {
	case errors.Is(err, dra.ErrNoDRA) || apierrors.IsForbidden(err):
		sl = nil
	case err != nil:
		return "", "", err
	}
	viaDRA := dra.ServesDevices(sl)
	switch {
	case viaDRA && len(dp) > 0:
		return "", fmt.Sprintf("the Node's allocatable has %s, and the NVIDIA DRA driver announces %d devices in the node's ResourceSlices",
			strings.Join(dp, ", "), len(dra.AnnouncedUUIDs(sl))), nil
	case viaDRA:
		return record.ServedByDRA, "", nil
	case len(dp) > 0:
		return record.ServedByDevicePlugin, "", nil
	}
	return "", "", nil
}

// devicePluginResources lists the device plugin's GPU resources
// (isGPUResource) the Node's allocatable holds a non-zero amount of, sorted:
// the Network Operator's nvidia.com/ resources are no GPU path.
func devicePluginResources(node *corev1.Node) []string {
	var out []string
	for name, q := range node.Status.Allocatable {
		if isGPUResource(name) && !q.IsZero() {
			out = append(out, string(name))
		}
	}
	sort.Strings(out)
	return out
}

// announced is what the NVIDIA DRA driver announces for the GPUs without
// DynamicMIG, sorted: each MIG device (one per compute instance: the driver
// walks the MIG device handles) of a GPU whose MIG mode is on, the whole
// GPU of every other GPU (nvlib.go enumerateAllPossibleDevices: "if
// !gpuInfo.migEnabled" only the full GPU, else only the existing MIG
// devices). migMode and migDevices are as WaitResources takes them.
func announced(migMode map[string]bool, migDevices map[string]string) []string {
	var out []string
	for uuid, on := range migMode {
		if !on {
			out = append(out, uuid)
		}
	}
	for uuid := range migDevices {
		out = append(out, uuid)
	}
	sort.Strings(out)
	return out
}

// waitSlices waits until the node's gpu.nvidia.com ResourceSlices announce
// exactly want (by UUID) and, with fresh, a kubelet plugin pod started after
// the change is Ready with the old ones gone; ok is false on timeout, with
// err saying what was announced last. The UUIDs are the proof that the
// slices were written after the change: every change destroys or creates a
// MIG device (a new UUID) or turns a GPU's MIG mode (its UUID announced or
// not), so the slices of before never match.
func (d *Disruptor) waitSlices(ctx context.Context, want []string, fresh *fresh.Proof, timeout time.Duration) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		sl, err := dra.NodeSlices(ctx, d.Client, d.Node)
		if err == nil && fresh != nil {
			err = fresh.CheckPods(ctx)
		}
		if err == nil {
			got := dra.AnnouncedUUIDs(sl)
			match := slices.Equal(got, want)
			switch {
			case match && (fresh == nil || fresh.Ready()):
				return true, nil
			case match:
				last = strings.ReplaceAll(fresh.Waiting(), "device plugin", "DRA kubelet plugin")
			default:
				last = describeMismatch(got, want)
			}
		} else if ctx.Err() == nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			if last == "" {
				last = ctx.Err().Error()
			}
			return false, errors.New(last)
		case <-time.After(draPollInterval):
		}
	}
}

// describeMismatch names what the slices announce that they should not,
// and what they lack.
func describeMismatch(got, want []string) string {
	var extra, missing []string
	for _, g := range got {
		if !slices.Contains(want, g) {
			extra = append(extra, g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	return fmt.Sprintf("the ResourceSlices announce %d devices: %d not on the GPUs %v, %d missing %v", len(got), len(extra), extra, len(missing), missing)
}
