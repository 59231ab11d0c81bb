package agent

import (
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
)

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

// rebootSpent says whether the reboot of the request for config was already
// made (or asked for): from the journal's mark, else, when the journal was
// lost, from a `rebooting` record on the Node for the same request. sameBoot
// is true when the reboot was asked on this boot and has not happened yet.
func (d *Daemon) rebootSpent(node *corev1.Node, config string) (spent, sameBoot bool, how string) {
	if m := d.Journal.State.RebootFor; m != nil && m.Config == config {
		if m.BootID == d.BootID() {
			// Journaled but not asked for: the agent stopped in between, no
			// reboot happened, asking now is not a second one.
			return m.Requested, m.Requested, "the journal"
		}
		return true, false, "the journal"
	}
	if node != nil && rebootRecorded(node, config) {
		return true, false, "a " + StateRebooting + " record on the Node"
	}
	return false, false, ""
}

// rebootRecorded reports a `rebooting` record for the current request of
// config in the Node's history: the newest records for config, up to the
// first one for another config (the label had another value then) or a
// success (that request was finished).
func rebootRecorded(node *corev1.Node, config string) bool {
	var hist []ChangeRecord
	if err := json.Unmarshal([]byte(node.Annotations[AnnotationHistory]), &hist); err != nil {
		// No history: the last change alone still tells.
		var last ChangeRecord
		if json.Unmarshal([]byte(node.Annotations[AnnotationLastChange]), &last) != nil {
			return false
		}
		hist = []ChangeRecord{last}
	}
	for _, r := range hist {
		if r.Config != config || r.Result == StateSuccess {
			return false
		}
		if r.Result == StateRebooting {
			return true
		}
	}
	return false
}

// forgetReboot drops the reboot mark unless it is for config ("" drops it
// whatever it is for); it reports whether the journal changed.
func (d *Daemon) forgetReboot(config string) bool {
	m := d.Journal.State.RebootFor
	if m == nil || (config != "" && m.Config == config) {
		return false
	}
	d.Journal.State.RebootFor = nil
	return true
}
