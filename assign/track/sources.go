package track

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
)

// draPrefix starts the id of a device a DRA claim gave (Held.ID).
const draPrefix = "dra:"

// PodResources is the Source of a Kubernetes node: the kubelet's
// PodResources List, one unary call per poll whatever the node runs. Device
// plugin devices under nvidia.com/ resources, and the NVIDIA DRA driver's
// devices of the containers' claims.
type PodResources struct {
	Socket string
}

var _ Source = (*PodResources)(nil)

// Held implements Source.
func (p *PodResources) Held(ctx context.Context) ([]Held, error) {
	pods, err := podresources.List(ctx, p.Socket)
	if err != nil {
		return nil, err
	}
	var out []Held
	for _, pod := range pods {
		for _, c := range pod.Containers {
			for res, ids := range c.Devices {
				if !strings.HasPrefix(res, podresources.GPUResourcePrefix) {
					continue
				}
				for _, id := range ids {
					out = append(out, Held{Namespace: pod.Namespace, Pod: pod.Name, Container: c.Name, Resource: res,
						ID: podresources.NormalizeDeviceID(id)})
				}
			}
			for _, d := range c.Claims {
				if d.Driver != dra.NVIDIADRADriver {
					continue
				}
				id := draPrefix + d.String()
				out = append(out, Held{Namespace: pod.Namespace, Pod: pod.Name, Container: c.Name, Resource: id, ID: id})
			}
		}
	}
	return out, nil
}

// Inventory resolves device ids through the agent's own GPU inventory
// (gpus.Discover) and, for DRA devices, the node's ResourceSlices. It reads
// them only when an id it has not seen appears: MIG device UUIDs are never
// reused, so a device once named keeps its name, and on an idle node whose
// pods churn on the same devices it reads nothing. NVML is opened for that
// one read (a session, Begin to End) and closed again, as the daemon's
// passes do: the agent holds no NVML session while idle.
type Inventory struct {
	GPU nvmlx.GPU
	// Slices lists the node's ResourceSlices (nil: no DRA).
	Slices func(ctx context.Context) ([]dra.Slice, error)
	Log    *slog.Logger

	mu      sync.Mutex
	devs    map[string]assign.Device // MIG UUID → device
	dra     map[string]string        // "dra:driver/pool/device" → UUID
	driver  string
	missing map[string]bool // ids the last read did not name
	reads   int
}

var _ Resolver = (*Inventory)(nil)

// Resolve implements Resolver.
func (v *Inventory) Resolve(ctx context.Context, ids []string) (map[string]assign.Device, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.devs == nil {
		v.devs, v.dra, v.missing = map[string]assign.Device{}, map[string]string{}, map[string]bool{}
	}
	var readGPUs, readSlices bool
	for _, id := range ids {
		if v.missing[id] {
			continue
		}
		if strings.HasPrefix(id, draPrefix) {
			uuid, ok := v.dra[id]
			readSlices = readSlices || !ok
			readGPUs = readGPUs || ok && v.unknown(uuid)
			continue
		}
		readGPUs = readGPUs || v.unknown(id)
	}
	// An id no read names is not asked about again until a read names
	// something new; one the reads could not answer (NVML or the API
	// unavailable) is asked about at the next poll.
	answered := true
	if readSlices && v.Slices != nil {
		answered = v.readSlices(ctx)
		for _, id := range ids {
			if uuid, ok := v.dra[id]; ok && v.unknown(uuid) {
				readGPUs = true
			}
		}
	}
	if readGPUs {
		answered = v.readGPUs() && answered
	}
	read := readGPUs || readSlices && v.Slices != nil
	out := map[string]assign.Device{}
	for _, id := range ids {
		uuid := id
		if strings.HasPrefix(id, draPrefix) {
			uuid = v.dra[id]
		}
		if d, ok := v.devs[uuid]; ok {
			out[id] = d
		} else if read && answered {
			v.missing[id] = true
		}
	}
	return out, v.driver
}

// unknown: a UUID not named by the last read. GPU UUIDs are never MIG
// devices; they count as known.
func (v *Inventory) unknown(uuid string) bool {
	_, ok := v.devs[uuid]
	return !ok && !strings.HasPrefix(uuid, "GPU-") && !v.missing[uuid]
}

// Reads counts the inventory reads (NVML sessions) so far.
func (v *Inventory) Reads() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.reads
}

// readSlices reads the node's ResourceSlices: which DRA device is which
// UUID. False: they could not be listed.
func (v *Inventory) readSlices(ctx context.Context) bool {
	slices, err := v.Slices(ctx)
	if err != nil {
		v.Log.Debug("assignment trail: cannot list the node's ResourceSlices", "err", err)
		return false
	}
	for d, uuid := range dra.DRAUUIDs(slices) {
		v.dra[draPrefix+d.String()] = uuid
	}
	return true
}

// readGPUs reads the GPU inventory in one NVML session; ids it did not
// name before are tried again. False: NVML could not be read (the ids are
// tried again at the next poll).
func (v *Inventory) readGPUs() bool {
	v.reads++
	inv, err := v.discover()
	if err != nil {
		v.Log.Debug("assignment trail: cannot read the GPU inventory", "err", err)
		return false
	}
	v.driver = inv.Driver
	clear(v.missing)
	for i, d := range inv.Devices {
		for _, gi := range inv.Instances[i] {
			for _, ci := range gi.ComputeInstances {
				if ci.UUID == "" {
					continue
				}
				v.devs[ci.UUID] = assign.Device{UUID: ci.UUID, Profile: ci.Profile, GPU: d.Index, GPUUUID: d.UUID,
					Placement: fmt.Sprintf("%d+%d", gi.Placement.Start, gi.Placement.Size)}
			}
		}
	}
	return true
}

func (v *Inventory) discover() (*gpus.Inventory, error) {
	if err := v.GPU.Begin(); err != nil {
		return nil, err
	}
	defer v.GPU.End()
	return gpus.Discover(v.GPU)
}
