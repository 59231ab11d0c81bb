package nvmlsim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/migagent/mig-agent/profiles"
)

// simStateVersion is the format version of the --sim-state file.
const simStateVersion = 1

// simState is the simulated hardware, as the --sim-state file holds it.
type simState struct {
	Version   int `json:"version"`
	BootCount int `json:"bootCount"`
	// DriverUnloaded simulates the nvidia kernel module unloaded (a driver
	// upgrade in progress): nvmlInit fails with DRIVER_NOT_LOADED.
	DriverUnloaded bool     `json:"driverUnloaded,omitempty"`
	GPUs           []simGPU `json:"gpus"`
}

type simGPU struct {
	Model      string    `json:"model"` // profiles.Model.Key
	UUID       string    `json:"uuid"`
	PCIBusID   string    `json:"pciBusId"`
	MigCurrent bool      `json:"migCurrent"`
	MigPending bool      `json:"migPending"`
	Instances  []simGI   `json:"gpuInstances"`
	Processes  []Process `json:"processes"`
	// HandleError, when set, is the NVML return every handle lookup of this
	// GPU gets ("ERROR_NO_PERMISSION": a GPU the agent may not open).
	HandleError string `json:"handleError,omitempty"`
}

type simGI struct {
	ID               int                `json:"id"`
	ProfileID        int                `json:"profileId"`
	Placement        profiles.Placement `json:"placement"`
	ComputeInstances []simCI            `json:"computeInstances"`
}

type simCI struct {
	ID        int    `json:"id"`
	ProfileID int    `json:"profileId"`
	UUID      string `json:"uuid"`
}

// clone deep-copies st so a mutation can be tried and dropped.
func (st *simState) clone() simState {
	out := *st
	out.GPUs = make([]simGPU, len(st.GPUs))
	for i, g := range st.GPUs {
		g.Processes = append([]Process{}, g.Processes...)
		gis := make([]simGI, len(g.Instances))
		for j, gi := range g.Instances {
			gi.ComputeInstances = append([]simCI{}, gi.ComputeInstances...)
			gis[j] = gi
		}
		g.Instances = gis
		out.GPUs[i] = g
	}
	return out
}

// uuidFrom formats the first 16 bytes of sha256(seed) like an NVIDIA UUID.
func uuidFrom(prefix, seed string) string {
	sum := sha256.Sum256([]byte(seed))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("%s-%s-%s-%s-%s-%s", prefix, h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// simGPUUUID is the stable UUID of the GPU at index i of model key.
func simGPUUUID(i int, key string) string {
	return uuidFrom("GPU", fmt.Sprintf("mig-agent-sim/gpu/%d/%s", i, key))
}

// simMIGUUID is the stable UUID of a MIG device: the same compute instance
// recreated in the same place gets the same UUID, as the device plugin and
// kubelet see it.
func simMIGUUID(gpuUUID string, giProfileID, start, ciProfileID, ciID int) string {
	return uuidFrom("MIG", fmt.Sprintf("mig-agent-sim/mig/%s/%d/%d/%d/%d", gpuUUID, giProfileID, start, ciProfileID, ciID))
}

// simPCIBusID is a distinct PCI bus id per GPU index.
func simPCIBusID(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x10+i) }

// newSimState is the state of freshly booted GPUs: MIG disabled, nothing else.
func newSimState(models []*profiles.Model) simState {
	st := simState{Version: simStateVersion}
	for i, m := range models {
		st.GPUs = append(st.GPUs, simGPU{
			Model: m.Key, UUID: simGPUUUID(i, m.Key), PCIBusID: simPCIBusID(i),
			Instances: []simGI{}, Processes: []Process{},
		})
	}
	return st
}

// readSimState reads and checks a state file; fs.ErrNotExist passes through.
func readSimState(path string) (simState, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return simState{}, err
		}
		return simState{}, fmt.Errorf("%w: %w", ErrState, err)
	}
	var st simState
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return simState{}, fmt.Errorf("%w: %s: %w", ErrState, path, err)
	}
	if err := st.check(); err != nil {
		return simState{}, fmt.Errorf("%w: %s: %w", ErrState, path, err)
	}
	return st, nil
}

// check verifies that a loaded state is one the simulator could have written.
func (st *simState) check() error {
	if st.Version != simStateVersion {
		return fmt.Errorf("version %d, want %d", st.Version, simStateVersion)
	}
	if len(st.GPUs) == 0 {
		return errors.New("no GPUs")
	}
	for i := range st.GPUs {
		g := &st.GPUs[i]
		m, ok := profiles.ModelByKey(g.Model)
		if !ok {
			return fmt.Errorf("GPU %d: unknown model %q (known: %s)", i, g.Model, knownModelKeys())
		}
		if g.UUID == "" || g.PCIBusID == "" {
			return fmt.Errorf("GPU %d: no UUID or PCI bus id", i)
		}
		if g.Instances == nil {
			g.Instances = []simGI{}
		}
		if g.Processes == nil {
			g.Processes = []Process{}
		}
		if len(g.Instances) > 0 && (!m.MigCapable || !g.MigCurrent) {
			return fmt.Errorf("GPU %d: GPU instances while MIG is off", i)
		}
		for j, gi := range g.Instances {
			p, ok := m.Catalogue.ByID(gi.ProfileID)
			if !ok {
				return fmt.Errorf("GPU %d: GPU instance %d: unknown profile id %d", i, gi.ID, gi.ProfileID)
			}
			for _, other := range g.Instances[:j] {
				if other.ID == gi.ID || other.Placement.Overlaps(gi.Placement) {
					return fmt.Errorf("GPU %d: GPU instances %d and %d clash", i, other.ID, gi.ID)
				}
			}
			for _, ci := range gi.ComputeInstances {
				if _, ok := computeByID(p, ci.ProfileID); !ok || ci.UUID == "" {
					return fmt.Errorf("GPU %d: GPU instance %d: bad compute instance %d", i, gi.ID, ci.ID)
				}
			}
		}
	}
	return nil
}

// modelKeys lists the state's GPU models in index order.
func (st *simState) modelKeys() []string {
	keys := make([]string, len(st.GPUs))
	for i, g := range st.GPUs {
		keys[i] = g.Model
	}
	return keys
}

// writeSimState writes st to path atomically: a temporary file in the same
// directory, renamed over path. A reader, or an agent killed at any moment
// and started again, sees the old file or the new one, never a part. It is
// not fsynced: the file stands for the GPUs' state, which a process crash
// does not lose, and a simulated reboot (reboot) is not a power loss; an
// fsync per NVML mutation made the simulator, not the agent, most of a
// change's time (about 40 mutations a node: 180–750 ms on a shared disk).
func writeSimState(path string, st *simState) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write sim state: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write sim state: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("write sim state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write sim state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write sim state: %w", err)
	}
	done = true
	return nil
}

// reboot applies a node reboot to st: pending MIG modes become current, GPU
// and compute instances and processes are gone.
func (st *simState) reboot() {
	for i := range st.GPUs {
		g := &st.GPUs[i]
		g.MigCurrent = g.MigPending
		g.Instances = []simGI{}
		g.Processes = []Process{}
	}
	st.BootCount++
}

// Reboot simulates a node reboot on the state file at statePath (the
// `sim reboot` command and --reboot-method sim): pending MIG modes become
// current, every GPU and compute instance and process is dropped, and the
// boot count grows by one. It takes the simulators' state lock.
func Reboot(statePath string) error {
	if statePath == "" {
		return fmt.Errorf("%w: sim reboot needs a state file (--sim-state)", ErrState)
	}
	if f := flockDir(filepath.Dir(statePath)); f != nil {
		defer f.Close()
	}
	st, err := readSimState(statePath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: no state file at %s", ErrState, statePath)
		}
		return err
	}
	st.reboot()
	return writeSimState(statePath, &st)
}

// simSessions counts the nvmlInit and nvmlShutdown calls of every process
// on one state: equal when no NVML session is open. They live beside the
// state file (SessionsPath), not in it: opening NVML changes no hardware,
// so a read-only session must not rewrite the GPUs' state.
type simSessions struct {
	Inits     int `json:"nvmlInits"`
	Shutdowns int `json:"nvmlShutdowns"`
}

// SessionsPath is the file beside a --sim-state file that counts NVML
// sessions ({"nvmlInits": N, "nvmlShutdowns": M}).
func SessionsPath(statePath string) string { return statePath + ".sessions" }

// countSession adds one Init (init) or one Shutdown to the counts beside
// path; the caller holds the state's lock.
func countSession(path string, mem *simSessions, init bool) error {
	c := *mem
	if path != "" {
		if raw, err := os.ReadFile(SessionsPath(path)); err == nil {
			_ = json.Unmarshal(raw, &c)
		}
	}
	if init {
		c.Inits++
	} else {
		c.Shutdowns++
	}
	if path != "" {
		data, _ := json.Marshal(c)
		tmp := SessionsPath(path) + ".tmp"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return fmt.Errorf("write NVML session counts: %w", err)
		}
		if err := os.Rename(tmp, SessionsPath(path)); err != nil {
			return fmt.Errorf("write NVML session counts: %w", err)
		}
	}
	*mem = c
	return nil
}

// readSessions returns the counts beside path (mem without a file).
func readSessions(path string, mem simSessions) simSessions {
	if path == "" {
		return mem
	}
	var c simSessions
	if raw, err := os.ReadFile(SessionsPath(path)); err == nil {
		_ = json.Unmarshal(raw, &c)
	}
	return c
}
