// Package track keeps the assignment trail (package assign) up to date:
// while the node is idle as much as during a change, a Tracker reads who
// holds which device (the kubelet's PodResources, or NVML's processes on a
// host without Kubernetes) at a modest interval, resolves the devices to
// MIG instances (Inventory), and shows each assignment three ways: an Event
// on the pod when it gets a device (MigDeviceAssigned), the metric
// migagent_mig_device_info while it holds it, and an entry in the history
// it saves through a Store.
package track

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/record"
)

// Held is one container holding one device, as the node reports it.
type Held struct {
	Namespace string
	Pod       string
	// PodUID where the source knows it (standalone: none).
	PodUID    string
	Container string
	// Resource is the device plugin's resource, or "dra:driver/pool/device".
	Resource string
	// ID is the device id: a MIG or GPU UUID (device plugin), or the DRA
	// device "dra:driver/pool/device" (resolved to a UUID by a Resolver).
	ID string
}

// Source lists what every container of the node holds now. An error means
// the node cannot tell now: nothing is closed on it.
type Source interface {
	Held(ctx context.Context) ([]Held, error)
}

// Resolver names the MIG devices of ids: UUID, profile, parent GPU and
// placement, and the driver version. IDs it cannot name as MIG devices
// (whole GPUs, devices of other vendors, unknown ids) are left out.
type Resolver interface {
	Resolve(ctx context.Context, ids []string) (devs map[string]assign.Device, driver string)
}

// Store keeps the history: Load once at start, Save after every change of
// it.
type Store interface {
	Load(ctx context.Context) (*assign.History, error)
	Save(ctx context.Context, h *assign.History) error
}

// Pods is the Kubernetes side of an assignment: the pod's UID, and the
// MigDeviceAssigned Event on it. Nil without Kubernetes.
type Pods interface {
	UID(ctx context.Context, namespace, name string) (string, error)
	Assigned(ctx context.Context, e assign.Entry) error
}

// Metrics shows the devices held now (migagent_mig_device_info).
type Metrics interface {
	SetHeldDevices(held []metrics.HeldDevice)
	SetCollectorError(collector string, failed bool)
}

// Tracker keeps the assignment trail of one node: each Poll compares what
// the Source reports with the history's open entries, opens and closes
// entries, posts an Event for each new one, saves the history when it
// changed and sets the metric.
type Tracker struct {
	Source  Source
	Resolve Resolver
	Store   Store
	// Pods is nil without Kubernetes.
	Pods Pods
	// Records are the node's change records, newest first (nil: none).
	Records func(ctx context.Context) []record.ChangeRecord
	Metrics Metrics
	Clock   clock.WithTicker
	Log     *slog.Logger
	// Interval between polls (Run).
	Interval time.Duration

	hist     *assign.History
	started  bool // the first poll after Load is done
	dirty    bool // the history changed and is not saved yet
	failures int  // polls failed in a row
}

// Run polls every Interval until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := t.Clock.NewTicker(t.Interval)
	defer tick.Stop()
	for {
		if err := t.Poll(ctx); err != nil && ctx.Err() == nil {
			t.failures++
			if t.failures == 1 {
				t.Log.Warn("assignment trail: cannot read or keep what holds the MIG devices; retrying every interval", "err", err)
			} else {
				t.Log.Debug("assignment trail: still failing", "attempts", t.failures, "err", err)
			}
		} else if t.failures > 0 {
			t.Log.Info("assignment trail: reading again", "after", t.failures)
			t.failures = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
	}
}

// Poll reads what is held now and updates the trail. Until the history
// has been loaded nothing else happens (a history that cannot be read is
// never overwritten).
func (t *Tracker) Poll(ctx context.Context) error {
	if t.hist == nil {
		h, err := t.Store.Load(ctx)
		if err != nil {
			return fmt.Errorf("loading the assignment history: %w", err)
		}
		t.hist = h
	}
	held, err := t.Source.Held(ctx)
	t.Metrics.SetCollectorError("assignments", err != nil)
	if err != nil {
		return err
	}
	now := t.Clock.Now().UTC().Truncate(time.Millisecond)
	current := t.resolve(ctx, held)
	t.close(ctx, current, now)
	fresh := t.open(ctx, current, now)
	t.started = true
	t.showHeld()
	for _, e := range fresh {
		if t.Pods == nil {
			continue
		}
		if err := t.Pods.Assigned(ctx, e); err != nil {
			t.Log.Warn("assignment trail: cannot post the MigDeviceAssigned Event", "pod", e.Namespace+"/"+e.Pod, "device", e.Device.UUID, "err", err)
		}
	}
	if !t.dirty {
		return nil
	}
	if err := t.hist.Bound(assign.MaxEntries, assign.MaxBytes); err != nil {
		return err
	}
	if err := t.Store.Save(ctx, t.hist); err != nil {
		return fmt.Errorf("saving the assignment history: %w", err)
	}
	t.dirty = false
	return nil
}

// assignment is one entry as the node reports it now.
type assignment struct {
	held   Held
	device assign.Device
	driver string
}

// resolve turns what is held into MIG device assignments by key. Devices
// the resolver does not name are kept only when their id is a MIG UUID
// (the GPU inventory could not be read): the trail names them by UUID.
func (t *Tracker) resolve(ctx context.Context, held []Held) map[key]assignment {
	ids := make([]string, 0, len(held))
	for _, h := range held {
		ids = append(ids, h.ID)
	}
	slices.Sort(ids)
	devs, driver := t.Resolve.Resolve(ctx, slices.Compact(ids))
	out := make(map[key]assignment, len(held))
	for _, h := range held {
		d, ok := devs[h.ID]
		if !ok {
			if !strings.HasPrefix(h.ID, "MIG-") {
				continue
			}
			d = assign.Device{UUID: h.ID, GPU: -1}
		}
		out[key{h.Namespace, h.Pod, h.Container, d.UUID}] = assignment{held: h, device: d, driver: driver}
	}
	return out
}

// close ends the open entries no longer held. On the first poll after a
// start, they ended while the agent was away: the end is now, when it
// learnt so; and an entry whose pod now has another UID (deleted and made
// again under its name meanwhile) ended too, the new pod getting its own.
func (t *Tracker) close(ctx context.Context, current map[key]assignment, now time.Time) {
	for i := range t.hist.Entries {
		e := &t.hist.Entries[i]
		if !e.Open() {
			continue
		}
		if _, ok := current[keyOf(*e)]; ok && t.samePod(ctx, e) {
			continue
		}
		end := now
		e.End, e.EndedBy = &end, "gone"
		if !t.started {
			e.EndedBy = "gone-while-down"
		}
		t.dirty = true
	}
}

// samePod reports whether the pod of open entry e is still the one
// recorded: asked on the first poll after a start only (between polls a
// pod's name is taken as its identity), and where the UID cannot be read,
// taken as the same.
func (t *Tracker) samePod(ctx context.Context, e *assign.Entry) bool {
	if t.started || t.Pods == nil || e.PodUID == "" {
		return true
	}
	uid, err := t.Pods.UID(ctx, e.Namespace, e.Pod)
	return err != nil || uid == "" || uid == e.PodUID
}

// open adds an entry for each assignment not yet open, in a stable order,
// and returns them.
func (t *Tracker) open(ctx context.Context, current map[key]assignment, now time.Time) []assign.Entry {
	isOpen := map[key]bool{}
	for _, e := range t.hist.Entries {
		if e.Open() {
			isOpen[keyOf(e)] = true
		}
	}
	var recs []record.ChangeRecord
	var fresh []assign.Entry
	for _, k := range sortedKeys(current) {
		if isOpen[k] {
			continue
		}
		a := current[k]
		if recs == nil && t.Records != nil {
			recs = t.Records(ctx)
		}
		e := assign.Entry{Namespace: a.held.Namespace, Pod: a.held.Pod, PodUID: a.held.PodUID, Container: a.held.Container,
			Resource: a.held.Resource, Device: a.device, Change: changeOf(recs, a.device), DriverVersion: a.driver, Start: now}
		if e.PodUID == "" && t.Pods != nil {
			uid, err := t.Pods.UID(ctx, e.Namespace, e.Pod)
			if err != nil {
				t.Log.Debug("assignment trail: cannot read the pod's UID", "pod", e.Namespace+"/"+e.Pod, "err", err)
			}
			e.PodUID = uid
		}
		t.hist.Entries = append(t.hist.Entries, e)
		fresh = append(fresh, e)
		t.dirty = true
	}
	return fresh
}

func sortedKeys(m map[key]assignment) []key {
	keys := make([]key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.pod, b.pod),
			cmp.Compare(a.container, b.container), cmp.Compare(a.uuid, b.uuid))
	})
	return keys
}

// showHeld sets migagent_mig_device_info from the open entries.
func (t *Tracker) showHeld() {
	var held []metrics.HeldDevice
	for _, e := range t.hist.Entries {
		if e.Open() {
			held = append(held, metrics.HeldDevice{UUID: e.Device.UUID, Profile: e.Device.Profile, GPU: e.Device.GPU,
				Namespace: e.Namespace, Pod: e.Pod, Container: e.Container})
		}
	}
	t.Metrics.SetHeldDevices(held)
}

// History returns a copy of the history as the tracker holds it (nil
// before the first Load).
func (t *Tracker) History() *assign.History {
	if t.hist == nil {
		return nil
	}
	h := *t.hist
	h.Entries = slices.Clone(t.hist.Entries)
	return &h
}

// changeOf names the change record that made device d's GPU instance, as
// far as recs (newest first) tell: walking back over the successful
// records whose geometry holds the instance, the newest that changed its
// GPU; where none did, the oldest that holds it. Nil where no record
// holds it (or d could not be resolved).
func changeOf(recs []record.ChangeRecord, d assign.Device) *assign.Change {
	start, _, ok := strings.Cut(d.Placement, "+")
	if d.GPU < 0 || !ok {
		return nil
	}
	gi := d.Profile
	if _, rest, ok := strings.Cut(gi, "c."); ok && strings.Contains(rest, "g.") {
		gi = rest // a compute instance profile "1c.3g.71gb": its GPU instance's
	}
	gpu := strconv.Itoa(d.GPU)
	var found *record.ChangeRecord
	for i := range recs {
		r := &recs[i]
		if r.Result != record.StateSuccess || r.Geometry == nil {
			continue
		}
		held := slices.ContainsFunc(r.Geometry[gpu], func(s string) bool {
			return strings.HasSuffix(s, "@"+start) && strings.Contains(s, gi)
		})
		if !held {
			break
		}
		found = r
		if slices.Contains(r.GPUsChanged, d.GPU) {
			break
		}
	}
	if found == nil {
		return nil
	}
	return &assign.Change{Config: found.Config, Hash: found.ConfigHash, Source: found.ConfigSource, At: found.FinishedAt}
}

// key identifies an assignment while it is open: the same container holding
// the same device.
type key struct{ namespace, pod, container, uuid string }

func keyOf(e assign.Entry) key { return key{e.Namespace, e.Pod, e.Container, e.Device.UUID} }

// The stores the agent keeps the history in.
var (
	_ Store = (*assign.ConfigMapStore)(nil)
	_ Store = (*assign.FileStore)(nil)
)
