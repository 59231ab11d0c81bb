package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/migagent/mig-agent/record"
)

// Phase is where a change stands, journaled before each step so a crash or
// a reboot at any point resumes from the right place.
type Phase string

// The phases, in order.
const (
	PhasePending   Phase = "pending"   // intent recorded, nothing touched
	PhaseDraining  Phase = "draining"  // taint, operand pause, evictions under way
	PhaseApplying  Phase = "applying"  // NVML mutations under way
	PhaseRebooting Phase = "rebooting" // a reboot was requested for this change
	PhaseRestoring Phase = "restoring" // GPUs done; restoring what was paused
	// PhaseRefreshing: GPUs done and restored; the device plugin is being
	// restarted and the node's allocatable awaited.
	PhaseRefreshing Phase = "refreshing"
)

// Change is the journaled state of the change in progress.
type Change struct {
	Config         string `json:"config"`
	Hash           string `json:"hash"`
	Source         string `json:"source"`
	PreviousConfig string `json:"previousConfig"`
	// PreviousHash is the applied config's hash when the change began.
	PreviousHash string `json:"previousHash,omitempty"`
	RequestedBy  string `json:"requestedBy"`
	RequestedVia string `json:"requestedVia,omitempty"`
	// RequestedBySource: where RequestedBy comes from (record.RequesterSource*).
	RequestedBySource string     `json:"requestedBySource,omitempty"`
	RequestedAt       *time.Time `json:"requestedAt,omitempty"`
	StartedAt         time.Time  `json:"startedAt"`
	// DisruptedAt: the rollout slot was taken and the disruption began.
	DisruptedAt   *time.Time `json:"disruptedAt,omitempty"`
	Phase         Phase      `json:"phase"`
	Step          string     `json:"step,omitempty"` // the NVML step last started
	GPUsChanged   []int      `json:"gpusChanged"`
	GPUsUntouched []int      `json:"gpusUntouched"`
	Evicted       []string   `json:"evicted,omitempty"`
	AffectedBy    string     `json:"affectedBy,omitempty"`
	// ServedBy: the allocation path that serves the node (record.ServedBy*).
	ServedBy   string `json:"servedBy,omitempty"`
	TaintAdded bool   `json:"taintAdded,omitempty"`
	// Operands holds the GPU Operator labels' values before the pause.
	Operands     json.RawMessage `json:"operands,omitempty"`
	StoppedUnits []string        `json:"stoppedUnits,omitempty"`
	Attempt      int             `json:"attempt,omitempty"`
	// StalePlugins: the device plugin pods ("namespace/name/uid") that read
	// the GPUs before they changed, restarted once the change is done.
	StalePlugins []string `json:"stalePlugins,omitempty"`
	// PluginsNoted: the device plugin pods were listed (StalePlugins may
	// be empty: none ran), so a resumed change does not list them again
	// after the GPUs changed.
	PluginsNoted bool `json:"pluginsNoted,omitempty"`
	// OldPlugins: every device plugin pod ("namespace/name/uid") the
	// change listed (NotePlugins): they read the GPUs before the change,
	// or did not advertise it when awaited; their figures never count as
	// the new geometry's. Kept after they are restarted.
	OldPlugins []string `json:"oldPlugins,omitempty"`
	// PluginsRestarted: plugin pods were restarted since the last wait for
	// the node's resources, so new ones are on their way.
	PluginsRestarted bool `json:"pluginsRestarted,omitempty"`
	// NodeUID is the UID of the Node object the change started on: a Node
	// created again under the same name is another object (reconcile/nodeuid.go).
	NodeUID string `json:"nodeUid,omitempty"`
}

// NotePlugins notes the device plugin pods listed now ("namespace/name/uid"):
// they are the ones to restart (StalePlugins), and they count among the
// change's old plugins (OldPlugins) for good.
func (c *Change) NotePlugins(pods []string) {
	c.StalePlugins = pods
	for _, p := range pods {
		if !slices.Contains(c.OldPlugins, p) {
			c.OldPlugins = append(c.OldPlugins, p)
		}
	}
}

// State is everything the journal file holds.
type State struct {
	// Change is the change in progress, nil when none.
	Change *Change `json:"change,omitempty"`
	Progress
	// Reboots counts the reboots the agent requested on this machine. It
	// survives the reboots themselves, so that migagent_reboots_total does
	// too: a counter held only in memory would show a reboot to no scrape.
	Reboots int `json:"reboots,omitempty"`
	// RebootFor marks the reboot asked for the current request: never a
	// second one for it (reconcile/reboot.go).
	RebootFor *RebootMark `json:"rebootFor,omitempty"`
}

// Progress is where the agent stands with the desired config, in one
// place: what the GPUs hold (Applied), the request last acted on to the end
// (Handled), and the backoff of a request that keeps failing (Failing,
// Attempts, RetryAt). The backoff is held in memory only: a restart
// retries at once.
type Progress struct {
	// Applied is the config last applied with success and its hash.
	Applied     string `json:"applied,omitempty"`
	AppliedHash string `json:"appliedHash,omitempty"`
	// Handled is the desired label value last acted on to the end.
	Handled string `json:"handled,omitempty"`
	// Failing is the config whose change failed and waits for its retry
	// at RetryAt; Attempts counts its failures in a row.
	Failing  string    `json:"-"`
	Attempts int       `json:"-"`
	RetryAt  time.Time `json:"-"`
}

// Succeeded: config (hash) is applied and handled; no backoff.
func (p *Progress) Succeeded(config, hash string) {
	*p = Progress{Applied: config, AppliedHash: hash, Handled: config}
}

// GaveUp: the change to config failed for good; it is handled (not retried
// until the request changes).
func (p *Progress) GaveUp(config string) {
	p.Handled, p.Failing, p.Attempts, p.RetryAt = config, "", 0, time.Time{}
}

// Retry schedules the retry of the failed change to config: after
// wait(n) for its n-th failure in a row, from now. It returns the wait.
func (p *Progress) Retry(config string, now time.Time, wait func(n int) time.Duration) time.Duration {
	if p.Failing != config {
		p.Attempts = 0
	}
	p.Failing = config
	p.Attempts++
	w := wait(p.Attempts)
	p.RetryAt = now.Add(w)
	return w
}

// Converged reports whether the GPUs hold what is asked: desired applied
// with success and handled, no change in progress and no retry pending; or
// nothing asked.
func (s *State) Converged(desired string, asked bool) bool {
	if !asked {
		return s.Change == nil
	}
	return s.Change == nil && s.Failing == "" && desired != "" && s.Applied == desired && s.Handled == desired
}

// ClearBackoff forgets the backoff: the next request is acted on at once.
func (p *Progress) ClearBackoff() { p.Failing, p.Attempts, p.RetryAt = "", 0, time.Time{} }

// Waiting reports whether a change to desired waits for its retry at now.
func (p *Progress) Waiting(desired string, now time.Time) bool {
	return desired == p.Failing && now.Before(p.RetryAt)
}

// ErrCorrupt: the journal file cannot be parsed. It is bad input
// (exit 2), not a failure to retry: a restart finds it as corrupt.
var ErrCorrupt = errors.New("corrupt journal")

// Journal is the on-disk journal in --state-dir. Writes are atomic
// (temporary file, fsync, rename), so a crash leaves the old or the new
// state, never a torn one.
type Journal struct {
	path  string
	State State
	// err is the error of the last Save or Probe (nil: it worked).
	err atomic.Pointer[error]
}

// Err is the error of the last Save or Probe, nil when it worked: a
// journal that cannot be written stops a change before anything is
// touched, and keeps the agent from counting as ready.
func (j *Journal) Err() error {
	if p := j.err.Load(); p != nil {
		return *p
	}
	return nil
}

// noted keeps err as the outcome of the last write, and returns it.
func (j *Journal) noted(err error) error {
	if err == nil {
		j.err.Store(nil)
	} else {
		j.err.Store(&err)
	}
	return err
}

// Open loads the journal from dir, creating dir if needed.
func Open(dir string) (*Journal, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	j := &Journal{path: filepath.Join(dir, "journal.json")}
	data, err := os.ReadFile(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading journal: %w", err)
	}
	if err := json.Unmarshal(data, &j.State); err != nil {
		return nil, fmt.Errorf("%w: %s (%v); move it away to start afresh", ErrCorrupt, j.path, err)
	}
	upgrade(&j.State, data)
	return j, nil
}

// Path is the journal file.
func (j *Journal) Path() string { return j.path }

// Save writes the journal atomically.
func (j *Journal) Save() error {
	data, err := json.MarshalIndent(&j.State, "", "  ")
	if err != nil {
		return j.noted(err)
	}
	return j.noted(WriteFileAtomic(j.path, data, 0o640))
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory, fsynced and renamed over path.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// RebootMark is the journal's memory of the reboot asked for one requested
// change: the desired config value it was for and the boot it was asked on.
// It outlives the change itself (a failure clears the change, a restart
// reads the journal afresh), so that no restart, crash or retry can ask for
// a second reboot for the same request. Only a new value of the desired
// label, or the change finishing with success, clears it.
type RebootMark struct {
	Config string    `json:"config"`
	BootID string    `json:"bootId"`
	At     time.Time `json:"at"`
	// Requested: the Rebooter returned without error.
	Requested bool `json:"requested,omitempty"`
}

// Probe checks that the journal's directory takes a write (a read-only or
// full file system fails here), without touching the journal itself.
func (j *Journal) Probe() (err error) {
	defer func() { j.noted(err) }()
	f, err := os.CreateTemp(filepath.Dir(j.path), ".probe.*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write([]byte("mig-agent\n"))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// upgrade reads what older versions journaled differently. Before the
// reboot memory was kept once (State.RebootFor), a change carried its own
// copy (rebootBootId, rebootRequested); a journal written then, with a
// change waiting for its reboot, is read as the mark it stands for.
func upgrade(st *State, data []byte) {
	var old struct {
		Change *struct {
			RebootBootID    string `json:"rebootBootId"`
			Rebooted        bool   `json:"rebooted"`
			RebootRequested bool   `json:"rebootRequested"`
		} `json:"change"`
	}
	if st.Change != nil && len(st.Change.StalePlugins) > 0 {
		st.Change.PluginsNoted = true
		if len(st.Change.OldPlugins) == 0 {
			st.Change.OldPlugins = slices.Clone(st.Change.StalePlugins)
		}
	}
	if st.Change == nil || st.RebootFor != nil || json.Unmarshal(data, &old) != nil || old.Change == nil || old.Change.RebootBootID == "" {
		return
	}
	st.RebootFor = &RebootMark{Config: st.Change.Config, BootID: old.Change.RebootBootID,
		Requested: old.Change.RebootRequested || old.Change.Rebooted}
}

// Record is the audit record of ch (nil: of no change) ending now with
// result and reason, as far as the journal knows it: what was asked, by
// whom, what changed and what was evicted. The caller adds what the
// journal does not hold (the agent and driver versions, the geometry,
// whether a reboot was made).
func (ch *Change) Record(result, reason string, now time.Time) record.ChangeRecord {
	rec := record.ChangeRecord{Result: result, Reason: reason, FinishedAt: now.UTC(),
		GPUsChanged: []int{}, GPUsUntouched: []int{}, EvictedPods: []string{}}
	if ch == nil {
		return rec
	}
	rec.Config, rec.PreviousConfig, rec.StartedAt = ch.Config, ch.PreviousConfig, ch.StartedAt.UTC()
	rec.ConfigHash, rec.ConfigSource, rec.PreviousConfigHash = ch.Hash, ch.Source, ch.PreviousHash
	rec.RequestedBy, rec.RequestedVia, rec.RequestedAt = ch.RequestedBy, ch.RequestedVia, ch.RequestedAt
	rec.RequestedBySource = ch.RequestedBySource
	rec.AffectedBy, rec.DisruptedAt, rec.ServedBy = ch.AffectedBy, ch.DisruptedAt, ch.ServedBy
	if ch.GPUsChanged != nil {
		rec.GPUsChanged = ch.GPUsChanged
	}
	if ch.GPUsUntouched != nil {
		rec.GPUsUntouched = ch.GPUsUntouched
	}
	if ch.Evicted != nil {
		rec.EvictedPods = ch.Evicted
	}
	return rec
}
