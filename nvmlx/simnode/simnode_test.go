package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/testkit/simlibtest"
)

// TestMigMinors keeps the driver's numbering (MIG user guide, "Device
// Nodes"): config 1, monitor 2, then per GPU and GPU instance id the
// instance's access minor followed by its 8 compute instances'.
func TestMigMinors(t *testing.T) {
	lines := strings.Split(strings.TrimSpace(migMinors(2)), "\n")
	for _, want := range []string{"config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4",
		"gpu0/gi0/ci7/access 11", "gpu0/gi1/access 12", "gpu0/gi2/access 21", "gpu1/gi0/access 138"} {
		found := false
		for _, l := range lines {
			found = found || l == want
		}
		if !found {
			t.Errorf("mig-minors lacks %q", want)
		}
	}
	seen := map[string]bool{}
	for _, l := range lines {
		f := strings.Fields(l)
		if seen[f[1]] {
			t.Errorf("minor %s twice", f[1])
		}
		seen[f[1]] = true
	}
	if len(lines) != 2+2*15*9 {
		t.Errorf("%d lines", len(lines))
	}
}

func TestProcDevicesAddsMajors(t *testing.T) {
	got := procDevices("Character devices:\n  1 mem\n\nBlock devices:\n  7 loop\n")
	if !strings.Contains(got, "Character devices:\n195 nvidia-frontend\n508 nvidia-caps\n509 nvidia-uvm\n  1 mem") {
		t.Fatalf("got %q", got)
	}
}

// TestSimNode runs commands in sim-node and reads what NVIDIA's tools
// read: the nvidia module, the GPUs' PCI devices, the driver's device
// nodes and MIG minors, the library on the loader path; and checks the
// host did not change. It needs root, as sim-node does.
func TestSimNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("sim-node needs root (mount namespaces); the test suite runs as root")
	}
	bin := simlibtest.SimNode(t)
	state := filepath.Join(t.TempDir(), "sim.json")
	if _, err := nvmlsim.New("h200x2", nvmlsim.Options{StatePath: state}, nil); err != nil {
		t.Fatal(err)
	}
	script := `set -e
grep -q '^nvidia ' /proc/modules
grep -q 'nvidia-caps' /proc/devices
cat /sys/bus/pci/devices/0000:11:00.0/vendor /sys/bus/pci/devices/0000:11:00.0/device /sys/bus/pci/devices/0000:11:00.0/class
basename "$(readlink -f /sys/bus/pci/devices/0000:11:00.0/driver)"
stat -c '%F %t:%T' /dev/nvidia1 /dev/nvidiactl /dev/nvidia-caps/nvidia-cap138
grep -c access /proc/driver/nvidia-caps/mig-minors
ls /sys/bus/pci/devices | wc -l
test -e /proc/self/status
sleep 2 & p=$!; sleep 0.5; test -e /proc/$p/status
echo "$LD_LIBRARY_PATH" | cut -d: -f1
echo "$MIG_AGENT_SIM"
`
	out, err := exec.Command(bin, "--state", state, "--", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("sim-node: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	hostPCI, _ := os.ReadDir("/sys/bus/pci/devices")
	want := []string{"0x10de", "0x2335", "0x030200", "nvidia",
		"character special file c3:1", "character special file c3:ff", "character special file 1fc:8a",
		"270", itoa(len(hostPCI) + 2), filepath.Dir(bin), "h200x2"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("inside sim-node:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, p := range []string{"/dev/nvidia1", "/dev/nvidiactl", "/sys/bus/pci/devices/0000:11:00.0"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists on the host after sim-node", p)
		}
	}
	if b, err := exec.Command(bin, "--state", state, "--", "sh", "-c", "exit 7").CombinedOutput(); err == nil {
		t.Errorf("exit 7 passed as success: %s", b)
	} else if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Errorf("exit status %v, want 7", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
