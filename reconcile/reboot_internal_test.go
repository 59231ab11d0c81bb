package reconcile

import (
	"testing"

	"github.com/migagent/mig-agent/record"
)

// TestRebootRecorded: the Node's newest records (newest first) show a
// reboot made for the current request of a config by a `rebooting`
// record or by a record written after it (reboot: true), even once the
// `rebooting` one has left the Node's short history; a success or another
// config ends the request.
func TestRebootRecorded(t *testing.T) {
	failedAfter := record.ChangeRecord{Config: "a", Result: record.StateFailed, Reboot: true}
	for _, tc := range []struct {
		name    string
		history []record.ChangeRecord
		want    bool
	}{
		{"rebooting record", []record.ChangeRecord{{Config: "a", Result: record.StateRebooting, Reboot: true}}, true},
		{"only records after the reboot", []record.ChangeRecord{failedAfter, failedAfter, failedAfter, failedAfter}, true},
		{"failed before any reboot", []record.ChangeRecord{{Config: "a", Result: record.StateFailed}}, false},
		{"a success ends the request", []record.ChangeRecord{{Config: "a", Result: record.StateSuccess}, failedAfter}, false},
		{"another config ends the request", []record.ChangeRecord{{Config: "b", Result: record.StateFailed}, failedAfter}, false},
		{"none", nil, false},
	} {
		if got := rebootRecorded(&Node{History: tc.history}, "a"); got != tc.want {
			t.Errorf("%s: rebootRecorded = %v, want %v", tc.name, got, tc.want)
		}
	}
}
