package journal

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.State.Change = &Change{Config: "all-balanced", Phase: PhaseDraining, Evicted: []string{"ns/p"}, TaintAdded: true}
	if err := j.Save(); err != nil {
		t.Fatal(err)
	}
	j2, err := Open(dir)
	if err != nil || j2.State.Change == nil || j2.State.Change.Phase != PhaseDraining || !j2.State.Change.TaintAdded {
		t.Fatalf("reloaded %+v err %v", j2.State.Change, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	if err := os.WriteFile(filepath.Join(dir, "journal.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt journal: %v", err)
	}
}

// A journal written before the reboot memory was kept once: the change's
// own reboot fields are read as the mark.
func TestJournalUpgrade(t *testing.T) {
	dir := t.TempDir()
	old := `{"change":{"config":"all-enabled","phase":"rebooting","gpusChanged":[0],"gpusUntouched":[],"rebootBootId":"boot-1","rebootRequested":true},"applied":"all-disabled","handled":""}`
	if err := os.WriteFile(filepath.Join(dir, "journal.json"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := j.State.RebootFor
	if m == nil || m.Config != "all-enabled" || m.BootID != "boot-1" || !m.Requested || j.State.Change.Phase != PhaseRebooting {
		t.Fatalf("upgraded mark %+v, change %+v", m, j.State.Change)
	}
}

// The state machine: the moves of a change as it goes, a resume and a
// reboot; not back to pending once the GPUs changed, nor out of refreshing
// to anything but applying.
func TestCanMove(t *testing.T) {
	for _, tc := range []struct {
		from, to Phase
		want     bool
	}{
		{PhasePending, PhaseDraining, true},
		{PhasePending, PhaseApplying, true},
		{PhaseDraining, PhasePending, true},
		{PhaseApplying, PhaseRebooting, true},
		{PhaseRebooting, PhaseDraining, true},
		{PhaseRestoring, PhaseRefreshing, true},
		{PhaseRefreshing, PhaseApplying, true},
		{PhaseApplying, PhasePending, false},
		{PhasePending, PhaseRestoring, false},
		{PhaseRefreshing, PhaseDraining, false},
		{Phase("unknown"), PhaseApplying, false},
	} {
		if got := CanMove(tc.from, tc.to); got != tc.want {
			t.Errorf("CanMove(%s, %s) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}
