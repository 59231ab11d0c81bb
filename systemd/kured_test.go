package systemd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/testkit/testsupport"
)

// The sentinel is written whole, names the change and the boot; at start
// the agent removes only its own sentinel of an earlier boot.
func TestSentinelRebooter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reboot-required")
	boot := "boot-1"
	r := &SentinelRebooter{Path: path, BootID: func() string { return boot }, Log: testsupport.Discard()}
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
	r.ClearStale() // same boot: kured has not rebooted yet
	if _, err := os.Stat(path); err != nil {
		t.Fatal("this boot's sentinel removed")
	}
	boot = "boot-2"
	r.ClearStale()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("an earlier boot's sentinel kept")
	}
	// Someone else's (a package upgrade's) stays.
	if err := os.WriteFile(path, []byte("*** System restart required ***\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.ClearStale()
	if _, err := os.Stat(path); err != nil {
		t.Fatal("someone else's sentinel removed")
	}
	// A directory that cannot be written: an error naming the sentinel.
	r.Path = filepath.Join(t.TempDir(), "missing", "reboot-required")
	if err := r.Reboot(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "kured's reboot sentinel") {
		t.Fatalf("err %v", err)
	}
}
