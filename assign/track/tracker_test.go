package track

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/dra"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

// fakeSource reports what the test sets, or err.
type fakeSource struct {
	held []Held
	err  error
}

func (f *fakeSource) Held(context.Context) ([]Held, error) { return f.held, f.err }

// fakeResolver names the devices of devs.
type fakeResolver struct{ devs map[string]assign.Device }

func (f fakeResolver) Resolve(_ context.Context, ids []string) (map[string]assign.Device, string) {
	out := map[string]assign.Device{}
	for _, id := range ids {
		if d, ok := f.devs[id]; ok {
			out[id] = d
		}
	}
	return out, "580.159.04"
}

// memStore keeps the encoded history, as a ConfigMap would.
type memStore struct {
	data  []byte
	saves int
	err   error
}

func (m *memStore) Load(context.Context) (*assign.History, error) { return assign.Decode(m.data) }
func (m *memStore) Save(_ context.Context, h *assign.History) error {
	if m.err != nil {
		return m.err
	}
	b, err := h.Encode()
	m.data, m.saves = b, m.saves+1
	return err
}

// fakePods counts Events; a pod's UID is "uid-NS-NAME", and its
// generation where gen is set (the pod made again).
type fakePods struct {
	mu     sync.Mutex
	events []assign.Entry
	gen    int
}

func (f *fakePods) UID(_ context.Context, ns, name string) (string, error) {
	if f.gen > 0 {
		return fmt.Sprintf("uid-%s-%s-%d", ns, name, f.gen), nil
	}
	return "uid-" + ns + "-" + name, nil
}
func (f *fakePods) Assigned(_ context.Context, e assign.Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
	return nil
}

// fakeMetrics keeps the devices held.
type fakeMetrics struct{ held []metrics.HeldDevice }

func (f *fakeMetrics) SetHeldDevices(h []metrics.HeldDevice) { f.held = h }
func (f *fakeMetrics) SetCollectorError(string, bool)        {}

var (
	devA = assign.Device{UUID: "MIG-a", Profile: "1g.18gb", GPU: 0, GPUUUID: "GPU-0", Placement: "0+1"}
	devB = assign.Device{UUID: "MIG-b", Profile: "3g.71gb", GPU: 1, GPUUUID: "GPU-1", Placement: "4+4"}
)

type rig struct {
	src   *fakeSource
	store *memStore
	pods  *fakePods
	met   *fakeMetrics
	clock *clocktesting.FakeClock
	recs  []record.ChangeRecord
}

func newRig() *rig {
	return &rig{src: &fakeSource{}, store: &memStore{}, pods: &fakePods{}, met: &fakeMetrics{},
		clock: clocktesting.NewFakeClock(time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC))}
}

// tracker is a fresh agent over the rig's node and store.
func (r *rig) tracker() *Tracker {
	return &Tracker{Source: r.src, Resolve: fakeResolver{devs: map[string]assign.Device{"MIG-a": devA, "MIG-b": devB}}, Store: r.store,
		Pods: r.pods, Records: func(context.Context) []record.ChangeRecord { return r.recs }, Metrics: r.met,
		Clock: r.clock, Log: testsupport.Discard(), Interval: time.Second}
}

func (r *rig) poll(t *testing.T, tr *Tracker) {
	t.Helper()
	if err := tr.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) history(t *testing.T) *assign.History {
	t.Helper()
	h, err := assign.Decode(r.store.data)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestTrackerOpensAndClosesAssignments(t *testing.T) {
	r := newRig()
	tr := r.tracker()
	r.poll(t, tr) // an idle node with no pods: nothing to save
	if r.store.saves != 0 {
		t.Errorf("saved %d times with nothing held", r.store.saves)
	}
	r.src.held = []Held{
		{Namespace: "ml", Pod: "trainer", Container: "main", Resource: "nvidia.com/mig-1g.18gb", ID: "MIG-a"},
		{Namespace: "ml", Pod: "gpu-pod", Container: "main", Resource: "nvidia.com/gpu", ID: "GPU-0"}, // a whole GPU: not a MIG device
	}
	r.poll(t, tr)
	start := r.clock.Now()
	r.clock.Step(time.Minute)
	r.poll(t, tr) // unchanged: no new entry, no save, no Event
	if r.store.saves != 1 || len(r.pods.events) != 1 {
		t.Fatalf("after two polls of one assignment: %d saves, %d Events; want 1 and 1", r.store.saves, len(r.pods.events))
	}
	if len(r.met.held) != 1 || r.met.held[0] != (metrics.HeldDevice{UUID: "MIG-a", Profile: "1g.18gb", GPU: 0, Namespace: "ml", Pod: "trainer", Container: "main"}) {
		t.Errorf("metric shows %+v", r.met.held)
	}
	r.src.held = nil
	r.poll(t, tr)
	h := r.history(t)
	if len(h.Entries) != 1 {
		t.Fatalf("history: %+v", h.Entries)
	}
	e := h.Entries[0]
	if !e.Start.Equal(start) || e.End == nil || !e.End.Equal(r.clock.Now()) || e.EndedBy != "gone" || e.Device != devA ||
		e.PodUID != "uid-ml-trainer" || e.DriverVersion != "580.159.04" {
		t.Errorf("entry %+v", e)
	}
	if len(r.met.held) != 0 {
		t.Errorf("metric still shows %+v", r.met.held)
	}
}

func TestTrackerRestartLosesNothing(t *testing.T) {
	r := newRig()
	r.src.held = []Held{
		{Namespace: "ml", Pod: "stays", Container: "main", ID: "MIG-a"},
		{Namespace: "ml", Pod: "goes", Container: "main", ID: "MIG-b"},
	}
	r.poll(t, r.tracker())
	// The agent is down; "goes" ends meanwhile. A new agent starts.
	r.clock.Step(10 * time.Minute)
	r.src.held = r.src.held[:1]
	tr := r.tracker()
	r.poll(t, tr)
	h := r.history(t)
	if len(h.Entries) != 2 || len(r.pods.events) != 2 {
		t.Fatalf("after the restart: %d entries, %d Events; want 2 and 2 (nothing new): %+v", len(h.Entries), len(r.pods.events), h.Entries)
	}
	for _, e := range h.Entries {
		switch e.Pod {
		case "stays":
			if !e.Open() {
				t.Errorf("the pod still running was closed: %+v", e)
			}
		case "goes":
			if e.End == nil || !e.End.Equal(r.clock.Now()) || e.EndedBy != "gone-while-down" {
				t.Errorf("the pod gone while the agent was down: %+v; want ended now, gone-while-down", e)
			}
		}
	}
}

// A pod deleted and made again under the same name while the agent was
// down is another assignment: the restarted agent ends the old one and
// opens the new one, with its own Event.
func TestTrackerRestartSeesARecreatedPod(t *testing.T) {
	r := newRig()
	r.src.held = []Held{{Namespace: "ml", Pod: "worker-0", Container: "main", ID: "MIG-a"}}
	r.poll(t, r.tracker())
	r.clock.Step(time.Hour)
	r.pods.gen = 2 // the StatefulSet made worker-0 again
	tr := r.tracker()
	r.poll(t, tr)
	r.clock.Step(time.Minute)
	r.poll(t, tr) // later polls do not ask again
	h := r.history(t)
	if len(h.Entries) != 2 || len(r.pods.events) != 2 {
		t.Fatalf("%d entries, %d Events; want 2 and 2: %+v", len(h.Entries), len(r.pods.events), h.Entries)
	}
	if old, fresh := h.Entries[0], h.Entries[1]; old.EndedBy != "gone-while-down" || fresh.PodUID != "uid-ml-worker-0-2" || !fresh.Open() {
		t.Errorf("old %+v, new %+v", old, fresh)
	}
}

func TestTrackerUnreadableSourceClosesNothing(t *testing.T) {
	r := newRig()
	tr := r.tracker()
	r.src.held = []Held{{Namespace: "ml", Pod: "p", Container: "main", ID: "MIG-a"}}
	r.poll(t, tr)
	r.src.err = errors.New("kubelet restarting")
	if err := tr.Poll(context.Background()); err == nil {
		t.Fatal("no error from an unreadable source")
	}
	if h := r.history(t); !h.Entries[0].Open() {
		t.Errorf("an unreadable PodResources closed %+v", h.Entries[0])
	}
}

func TestTrackerUnreadableHistoryIsNotOverwritten(t *testing.T) {
	r := newRig()
	r.store.data = []byte(`{"entries": [`)
	r.src.held = []Held{{Namespace: "ml", Pod: "p", Container: "main", ID: "MIG-a"}}
	err := r.tracker().Poll(context.Background())
	if !errors.Is(err, assign.ErrCorrupt) || r.store.saves != 0 || string(r.store.data) != `{"entries": [` {
		t.Errorf("Poll = %v, %d saves; want ErrCorrupt and the history left as it is", err, r.store.saves)
	}
}

func TestTrackerSaveFailureIsRetried(t *testing.T) {
	r := newRig()
	tr := r.tracker()
	r.store.err = errors.New("apiserver down")
	r.src.held = []Held{{Namespace: "ml", Pod: "p", Container: "main", ID: "MIG-a"}}
	if err := tr.Poll(context.Background()); err == nil {
		t.Fatal("no error from a failing save")
	}
	r.store.err = nil
	r.poll(t, tr)
	if h := r.history(t); len(h.Entries) != 1 || r.store.saves != 1 {
		t.Errorf("after the save failed once: %+v, %d saves", h.Entries, r.store.saves)
	}
}

// A pod name is data: whatever it holds, it cannot add, end or change
// another entry, in the stored document or in the text output.
func TestHostileNamesCannotForgeEntries(t *testing.T) {
	r := newRig()
	tr := r.tracker()
	hostile := `x","end":"2026-01-01T00:00:00Z"},{"namespace":"kube-system","pod":"forged","container":"c","device":{"uuid":"MIG-b","gpu":1},"start":"2026-01-01T00:00:00Z` +
		"\n2026-12-01T14:00:00Z  (held)  kube-system/forged"
	r.src.held = []Held{
		{Namespace: "ml", Pod: hostile, Container: "main\"}]}", ID: "MIG-a"},
		{Namespace: "ml", Pod: "honest", Container: "main", ID: "MIG-b"},
	}
	r.poll(t, tr)
	h := r.history(t)
	if len(h.Entries) != 2 || h.Entries[1].Pod != hostile || h.Entries[1].Container != "main\"}]}" || !h.Entries[1].Open() {
		t.Fatalf("entries: %+v", h.Entries)
	}
	for _, e := range h.Entries {
		if e.Namespace == "kube-system" || e.Pod == "forged" {
			t.Errorf("a forged entry: %+v", e)
		}
	}
	var text bytes.Buffer
	if err := assign.WriteText(&text, h); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(text.String()), "\n")
	if len(lines) != 3 { // the header, two entries
		t.Errorf("text output has %d lines, want 3:\n%s", len(lines), text.String())
	}
}

func TestBoundDropsOldestAndSaysSo(t *testing.T) {
	h := &assign.History{Node: "n"}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range 30 {
		s, e := t0.Add(time.Duration(i)*time.Minute), t0.Add(time.Duration(i)*time.Minute+30*time.Second)
		h.Entries = append(h.Entries, assign.Entry{Namespace: "ns", Pod: "p", Container: "c", Device: devA, Start: s, End: &e})
	}
	h.Entries[0].End = nil // the oldest is still open: it stays
	if err := h.Bound(10, assign.MaxBytes); err != nil {
		t.Fatal(err)
	}
	if len(h.Entries) != 10 || h.Dropped != 20 || !h.Entries[0].Open() {
		t.Fatalf("after the bound: %d entries, %d dropped, first open %v", len(h.Entries), h.Dropped, h.Entries[0].Open())
	}
	if h.Entries[1].Start != t0.Add(21*time.Minute) {
		t.Errorf("kept from %s, want the newest closed ones", h.Entries[1].Start)
	}
	if !strings.Contains(h.DroppedNote, "20 oldest entries dropped") || h.DroppedBefore == nil {
		t.Errorf("note %q, before %v", h.DroppedNote, h.DroppedBefore)
	}
	// Bytes bound too.
	if err := h.Bound(100, 2048); err != nil {
		t.Fatal(err)
	}
	if b, _ := h.Encode(); len(b) > 2048 || h.Dropped <= 20 {
		t.Errorf("%d bytes, %d dropped", len(b), h.Dropped)
	}
}

func TestChangeOfNamesTheRecordThatMadeTheDevice(t *testing.T) {
	recs := []record.ChangeRecord{ // newest first
		{Config: "gpu1-only", Result: record.StateSuccess, GPUsChanged: []int{1},
			Geometry: map[string][]string{"0": {"1g.18gb@0", "3g.71gb@4"}, "1": {"7g.141gb@0"}}},
		{Config: "failed-one", Result: record.StateFailed},
		{Config: "mixed", Result: record.StateSuccess, GPUsChanged: []int{0}, ConfigHash: "sha256:m", ConfigSource: "generated",
			Geometry: map[string][]string{"0": {"1g.18gb@0", "3g.71gb@4"}}},
		{Config: "before", Result: record.StateSuccess, GPUsChanged: []int{0}, Geometry: map[string][]string{"0": {"7g.141gb@0"}}},
	}
	if c := changeOf(recs, devA); c == nil || c.Config != "mixed" || c.Hash != "sha256:m" || c.Source != "generated" {
		t.Errorf("change of %s: %+v, want mixed", devA.UUID, c)
	}
	if c := changeOf(recs, assign.Device{UUID: "MIG-x", GPU: -1}); c != nil {
		t.Errorf("an unresolved device has change %+v", c)
	}
}

// The inventory opens NVML only when a device it has not named appears:
// pods churning on known devices cost no NVML session.
func TestInventoryReadsOnlyForUnknownDevices(t *testing.T) {
	s := testsupport.NewSim(t, "h200x1", nvmlsim.Options{})
	f := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 7}\n")
	if _, err := testsupport.ApplyConfig(t, s, f, "c", gpusOpts()); err != nil {
		t.Fatal(err)
	}
	inv := &Inventory{GPU: s, Log: testsupport.Discard()}
	insts, err := s.Instances(0)
	if err != nil {
		t.Fatal(err)
	}
	uuid := insts[2].ComputeInstances[0].UUID
	for range 5 {
		devs, drv := inv.Resolve(context.Background(), []string{uuid, "GPU-whole"})
		if d := devs[uuid]; d.Profile != "1g.18gb" || d.GPU != 0 || d.Placement != "2+1" || drv == "" {
			t.Fatalf("resolved %+v, driver %q", d, drv)
		}
	}
	if n := inv.Reads(); n != 1 {
		t.Errorf("%d inventory reads for one device polled 5 times, want 1", n)
	}
	inv.Resolve(context.Background(), []string{"MIG-unknown"})
	inv.Resolve(context.Background(), []string{"MIG-unknown"})
	if n := inv.Reads(); n != 2 {
		t.Errorf("%d reads after an unknown id polled twice, want 2 (one more, once)", n)
	}
}

func gpusOpts() gpus.ApplyOptions { return gpus.ApplyOptions{} }

// On the DRA path a container's device is the claim's driver/pool/device:
// the node's ResourceSlices name its UUID (listed once), the GPU inventory
// its profile.
func TestInventoryResolvesDRADevices(t *testing.T) {
	s := testsupport.NewSim(t, "h200x1", nvmlsim.Options{})
	f := testsupport.ParseSpec(t, "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"3g.71gb\": 2}\n")
	if _, err := testsupport.ApplyConfig(t, s, f, "c", gpusOpts()); err != nil {
		t.Fatal(err)
	}
	insts, err := s.Instances(0)
	if err != nil {
		t.Fatal(err)
	}
	uuid := insts[1].ComputeInstances[0].UUID
	lists := 0
	inv := &Inventory{GPU: s, Log: testsupport.Discard(), Slices: func(context.Context) ([]dra.Slice, error) {
		lists++
		return []dra.Slice{{Driver: dra.NVIDIADRADriver, Pool: "node-1", Devices: []dra.SliceDevice{
			{Name: "gpu-0-mig-9-4-4", Type: dra.DRATypeMIG, UUID: uuid}}}}, nil
	}}
	id := "dra:" + dra.NVIDIADRADriver + "/node-1/gpu-0-mig-9-4-4"
	for range 3 {
		devs, _ := inv.Resolve(context.Background(), []string{id})
		if d := devs[id]; d.UUID != uuid || d.Profile != "3g.71gb" || d.Placement != "4+4" {
			t.Fatalf("resolved %+v", d)
		}
	}
	if lists != 1 || inv.Reads() != 1 {
		t.Errorf("%d slice lists, %d inventory reads for one DRA device polled 3 times; want 1 and 1", lists, inv.Reads())
	}
}

// The bound keeps entries fairly among namespaces: a tenant churning pods
// drops its own oldest entries, not another team's older history; where
// both hold more than their share, each keeps about half.
func TestBoundIsFairAmongNamespaces(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	add := func(h *assign.History, ns string, n int, from time.Time) {
		for i := range n {
			s := from.Add(time.Duration(i) * time.Second)
			e := s.Add(500 * time.Millisecond)
			h.Entries = append(h.Entries, assign.Entry{Namespace: ns, Pod: fmt.Sprintf("p%d", i), Container: "c", Device: devA, Start: s, End: &e})
		}
	}
	count := func(h *assign.History, ns string) int {
		n := 0
		for _, e := range h.Entries {
			if e.Namespace == ns {
				n++
			}
		}
		return n
	}
	h := &assign.History{Node: "n"}
	add(h, "team", 20, t0)                    // older history of another team
	add(h, "tenant", 1000, t0.Add(time.Hour)) // a tenant's churn, newer
	if err := h.Bound(100, assign.MaxBytes); err != nil {
		t.Fatal(err)
	}
	if got := count(h, "team"); got != 20 || len(h.Entries) != 100 || h.Dropped != 920 {
		t.Fatalf("team keeps %d of 20, %d entries, %d dropped; want all 20, 100, 920", got, len(h.Entries), h.Dropped)
	}
	if last := h.Entries[len(h.Entries)-1]; last.Namespace != "tenant" || last.Pod != "p999" {
		t.Errorf("the tenant's newest entry went: last %+v", last)
	}
	h = &assign.History{Node: "n"}
	add(h, "team", 300, t0)
	add(h, "tenant", 3000, t0.Add(time.Hour))
	if err := h.Bound(400, assign.MaxBytes); err != nil {
		t.Fatal(err)
	}
	if team, tenant := count(h, "team"), count(h, "tenant"); team != 200 || tenant != 200 {
		t.Errorf("both over their share: team %d, tenant %d, want 200 each", team, tenant)
	}
	for i := 1; i < len(h.Entries); i++ {
		if h.Entries[i].Namespace == h.Entries[i-1].Namespace && h.Entries[i].Start.Before(h.Entries[i-1].Start) {
			t.Fatal("the entries are out of order")
		}
	}
}
