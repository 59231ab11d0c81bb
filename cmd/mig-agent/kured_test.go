package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/internal/testsupport"
)

// The sentinel is written whole, names the change and the boot; at start
// the agent removes only its own sentinel of an earlier boot.
func TestSentinelRebooter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reboot-required")
	boot := "boot-1"
	r := &sentinelRebooter{path: path, bootID: func() string { return boot }, log: testsupport.Discard()}
	if err := r.Reboot(context.Background(), "mig-agent: MIG mode change of config all-1g.5gb"); err != nil {
		t.Fatal(err)
	}
	body, _ := os.ReadFile(path)
	if string(body) != "*** System restart required ***\nmig-agent: mig-agent: MIG mode change of config all-1g.5gb; boot boot-1\n" {
		t.Fatalf("sentinel %q", body)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
	r.clearStale() // same boot: kured has not rebooted yet
	if _, err := os.Stat(path); err != nil {
		t.Fatal("this boot's sentinel removed")
	}
	boot = "boot-2"
	r.clearStale()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("an earlier boot's sentinel kept")
	}
	// Someone else's (a package upgrade's) stays.
	if err := os.WriteFile(path, []byte("*** System restart required ***\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.clearStale()
	if _, err := os.Stat(path); err != nil {
		t.Fatal("someone else's sentinel removed")
	}
	// A directory that cannot be written: an error naming the sentinel.
	r.path = filepath.Join(t.TempDir(), "missing", "reboot-required")
	if err := r.Reboot(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "kured's reboot sentinel") {
		t.Fatalf("err %v", err)
	}
}

func TestSettingsRebootKured(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	s, err := settingsFor(t, "--reboot-method", "kured")
	if err != nil || s.RebootSentinel != "/var/run/reboot-required" || s.Validate() != nil {
		t.Fatalf("%+v %v", s, err)
	}
	s, _ = settingsFor(t, "--reboot-method", "kured", "--reboot-sentinel", "relative/file")
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "--reboot-sentinel") {
		t.Fatalf("relative sentinel: %v", err)
	}
}
