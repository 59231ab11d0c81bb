// Package assign is the assignment trail: which container of which pod held
// which MIG device, from when to when, as a bounded history that outlives
// the pod (the ConfigMap <node>-mig-assignments in the agent's namespace,
// or a JSON file beside the journal without Kubernetes): its format, its
// stores and how a reader reads it. Package assign/track writes it (the
// Tracker); readers (`mig-agent status`, `mig-agent assignments`, the
// planner) need only this package, which links neither NVML nor the
// kubelet's PodResources.
//
// The history is one JSON document, encoded and decoded by encoding/json
// only: pod, namespace and container names are string values in it, never
// text spliced into a structure, so no name can forge or end an entry.
package assign

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Bounds of the history: the oldest entries are dropped beyond them (closed
// ones first), and the history counts what it dropped. A ConfigMap holds at
// most 1 MiB; MaxBytes leaves room for its metadata.
const (
	MaxEntries = 2000
	MaxBytes   = 768 << 10
)

// HistoryKey is the ConfigMap key (and the file's only content) holding the
// history document.
const HistoryKey = "history.json"

// ErrCorrupt wraps every error decoding a history.
var ErrCorrupt = errors.New("assignment history does not decode")

// History is the assignment trail of one node, oldest entry first.
type History struct {
	// Node is the node the trail is about.
	Node string `json:"node"`
	// Dropped counts the oldest entries dropped to keep the bounds, over the
	// history's whole life; DroppedNote says so in words, and DroppedBefore
	// is the end (or start) of the newest entry dropped: the history is
	// complete from then on.
	Dropped       int        `json:"dropped"`
	DroppedNote   string     `json:"droppedNote,omitempty"`
	DroppedBefore *time.Time `json:"droppedBefore,omitempty"`
	// Entries are the assignments, oldest start first; open ones have no
	// end.
	Entries []Entry `json:"entries"`
}

// Entry is one assignment: a container of a pod held one MIG device from
// Start to End.
type Entry struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// PodUID is the pod's UID as the API server reported it when the
	// assignment was seen; empty where the pod could not be read (standalone:
	// the process id).
	PodUID    string `json:"podUID,omitempty"`
	Container string `json:"container"`
	// Resource is the device plugin's resource name ("nvidia.com/mig-1g.18gb"),
	// or "dra:" and the claim's driver/pool/device on the DRA path.
	Resource string `json:"resource,omitempty"`
	Device   Device `json:"device"`
	// Change is the change record that made the device's GPU instance, as
	// far as the node's records tell; nil where they do not.
	Change *Change `json:"change,omitempty"`
	// DriverVersion is the NVIDIA driver version when the assignment was
	// seen.
	DriverVersion string     `json:"driverVersion,omitempty"`
	Start         time.Time  `json:"start"`
	End           *time.Time `json:"end,omitempty"`
	// EndedBy says how the end was learnt: "gone" (no longer in
	// PodResources at a poll), "gone-while-down" (gone when the agent
	// started again: the end is when it learnt so).
	EndedBy string `json:"endedBy,omitempty"`
}

// Device is a MIG device as the agent's GPU inventory names it.
type Device struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile,omitempty"`
	// GPU is the NVML index of the parent GPU; -1 where the device could not
	// be resolved (then Profile and Placement are empty).
	GPU     int    `json:"gpu"`
	GPUUUID string `json:"gpuUUID,omitempty"`
	// Placement is the GPU instance's placement, "start+size" in memory
	// slices ("4+2").
	Placement string `json:"placement,omitempty"`
}

// Change names a change record: the one whose geometry made the device.
type Change struct {
	Config string    `json:"config"`
	Hash   string    `json:"hash,omitempty"`
	Source string    `json:"source,omitempty"`
	At     time.Time `json:"at"`
}

// Open reports whether the assignment still holds.
func (e Entry) Open() bool { return e.End == nil }

// Decode reads a history document. An empty document is an empty history.
func Decode(data []byte) (*History, error) {
	h := &History{}
	if len(data) == 0 {
		return h, nil
	}
	if err := json.Unmarshal(data, h); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return h, nil
}

// Encode writes the history as one JSON document.
func (h *History) Encode() ([]byte, error) {
	if h.Entries == nil {
		h.Entries = []Entry{}
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encoding the assignment history: %w", err)
	}
	return b, nil
}

// Bound drops entries until the history holds at most maxEntries and
// encodes within maxBytes, fairly among namespaces: each entry dropped is
// the oldest of the namespace that holds the most entries then (closed
// entries first; open ones only where closed ones are not enough). A
// tenant churning pods flushes its own history, not another team's: a
// namespace keeps its entries while it holds no more than the others. It
// counts the dropped entries and says so in DroppedNote.
func (h *History) Bound(maxEntries, maxBytes int) error {
	for {
		b, err := h.Encode()
		if err != nil {
			return err
		}
		if len(h.Entries) <= maxEntries && len(b) <= maxBytes {
			return nil
		}
		if len(h.Entries) == 0 {
			return fmt.Errorf("an empty assignment history exceeds %d bytes", maxBytes)
		}
		// Drop a tenth at a time (at least one), so a full history is
		// bounded in few encodings.
		n := max(1, len(h.Entries)-maxEntries, len(h.Entries)/10)
		h.drop(n)
	}
}

// drop removes n entries, closed ones first, each the oldest of the
// namespace that holds the most entries at that moment (ties: the
// namespace whose candidate is oldest). O(n × namespaces + entries).
func (h *History) drop(n int) {
	gone := make([]bool, len(h.Entries))
	dropped := 0
	for pass := 0; pass < 2 && dropped < n; pass++ {
		// Pass 0 drops closed entries only; pass 1 any.
		held := map[string]int{}    // namespace → entries it still holds
		cands := map[string][]int{} // namespace → its droppable entries, oldest first
		for i, e := range h.Entries {
			if gone[i] {
				continue
			}
			held[e.Namespace]++
			if pass == 1 || !e.Open() {
				cands[e.Namespace] = append(cands[e.Namespace], i)
			}
		}
		for dropped < n {
			ns, best := "", -1
			for s, idx := range cands {
				if len(idx) == 0 {
					continue
				}
				if best < 0 || held[s] > held[ns] || held[s] == held[ns] && h.Entries[idx[0]].Start.Before(h.Entries[best].Start) ||
					held[s] == held[ns] && h.Entries[idx[0]].Start.Equal(h.Entries[best].Start) && s < ns {
					ns, best = s, idx[0]
				}
			}
			if best < 0 {
				break
			}
			cands[ns], held[ns] = cands[ns][1:], held[ns]-1
			gone[best] = true
			dropped++
			e := h.Entries[best]
			t := e.Start
			if e.End != nil {
				t = *e.End
			}
			if h.DroppedBefore == nil || t.After(*h.DroppedBefore) {
				h.DroppedBefore = &t
			}
		}
	}
	out := make([]Entry, 0, len(h.Entries)-dropped)
	for i, e := range h.Entries {
		if !gone[i] {
			out = append(out, e)
		}
	}
	h.Entries = out
	h.Dropped += dropped
	h.DroppedNote = fmt.Sprintf("%d oldest entries dropped (each the oldest of the namespace holding the most entries) to keep the history within %d entries and %d KiB; it is complete from %s on",
		h.Dropped, MaxEntries, MaxBytes>>10, h.DroppedBefore.UTC().Format(time.RFC3339))
}

// At lists the entries that held at t (started at or before t, not ended
// before t), optionally only those of one device UUID.
func (h *History) At(t time.Time, uuid string) []Entry {
	var out []Entry
	for _, e := range h.Entries {
		if uuid != "" && e.Device.UUID != uuid {
			continue
		}
		if e.Start.After(t) || (e.End != nil && e.End.Before(t)) {
			continue
		}
		out = append(out, e)
	}
	return out
}
