// Package realnode runs a real node for tests: the real kubelet
// (k8s.io/kubernetes cmd/kubelet, built by hack/kube-apiserver.sh
// --with-kubelet from the same module and version as the API server, and
// cached beside it) over a real containerd and runc (Debian's packages,
// installed by hack/ensure-containerd.sh), registered with the test API
// server that testkit/kubetest starts. Pod admission, the pod lifecycle,
// eviction, device-plugin registration, Allocate and PodResources are the
// kubelet's own.
//
// Start runs containerd with a private config (root, state and socket under
// a temporary directory; CRI with cgroupfs; CNI from /usr/lib/cni with a
// bridge of its own), imports the images the harness builds here as OCI
// archives (PauseImage as the sandbox image, SleepImage for pods: nothing
// can be pulled), starts the kubelet with a KubeletConfiguration that lets
// it run on this machine (cgroup v1 hybrid, no swap accounting, no QoS
// cgroups), and waits for the Node to be Ready. At the test's end it stops
// the pods, the kubelet and containerd, unmounts what they mounted,
// deletes the bridge and the Node, and puts back the kernel settings the
// kubelet changes.
//
// One real kubelet per machine: the device-plugin directory
// /var/lib/kubelet/device-plugins is fixed in the kubelet, whatever its
// --root-dir says, so Start holds a machine-wide lock (Lock) until the
// test ends.
package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/migagent/mig-agent/testkit/kubetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"
)

const (
	// CNIBinDir is where Debian's containernetworking-plugins puts the plugins.
	CNIBinDir = "/usr/lib/cni"
	// Lock is the machine-wide lock file: one real kubelet at a time.
	Lock = "/var/lib/kubelet/mig-agent-realnode.lock"
	// EnsureScript installs what Start needs from Debian, relative to the
	// module root.
	EnsureScript = "hack/ensure-containerd.sh"
	// readyTimeout bounds the wait for the Node to be Ready.
	readyTimeout = 2 * time.Minute
	// lockTimeout bounds the wait for another test's kubelet to end.
	lockTimeout = 10 * time.Minute
	// checkpoint is the kubelet device manager's checkpoint.
	checkpoint = pluginapi.DevicePluginPath + "kubelet_internal_checkpoint"
)

// Node is a real kubelet over a real containerd, registered as Name.
type Node struct {
	Name   string
	Dir    string // the temporary directory holding everything below
	Client kubernetes.Interface

	t           testing.TB
	containerd  string // its gRPC socket
	kubeletRoot string
	podLogs     string
	bridge      string
	sysctls     map[string]string
	procs       []*proc
	watchdog    *exec.Cmd
	Timings     Timings
}

// Timings are what Start measured, for the test's log and the docs.
type Timings struct {
	Build, Images, Containerd, Kubelet, Ready time.Duration
}

// proc is a server Start runs: its log and how it ended.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	exited    chan struct{}
	err       error
}

// Start runs a real node for t and returns it once its Node is Ready. It
// fails t, naming what is missing, when the machine lacks something (not
// root, containerd, runc or the CNI plugins missing: EnsureScript
// installs them); it skips nothing. kubetest.Main must run the API server.
func Start(t testing.TB) *Node {
	t.Helper()
	client := kubetest.Client(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(); err != nil {
		t.Fatalf("realnode: %v", err)
	}
	lock(t)
	// The device manager's checkpoint lives in the fixed directory: a
	// fresh node starts without the last node's allocations.
	_ = os.Remove(checkpoint)
	dir, err := os.MkdirTemp("", "realnode-")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{
		Name: "realnode-" + randSuffix(), Dir: dir, Client: client, t: t,
		containerd:  filepath.Join(dir, "containerd.sock"),
		kubeletRoot: filepath.Join(dir, "kubelet"),
		podLogs:     filepath.Join(dir, "pod-logs"),
		bridge:      "rn" + randSuffix(),
	}
	t.Cleanup(n.stop)
	t0 := time.Now()
	kubelet := kubeletBinary(t, root)
	if err := buildPrograms(root, dir); err != nil {
		t.Fatal(err)
	}
	n.Timings.Build = time.Since(t0)
	t0 = time.Now()
	if err := n.startContainerd(); err != nil {
		t.Fatalf("containerd: %v", err)
	}
	n.Timings.Containerd = time.Since(t0)
	t0 = time.Now()
	for ref, prog := range map[string]string{PauseImage: "pause", SleepImage: "pause", PluginImage: "deviceplugin"} {
		if err := n.importImage(ref, prog); err != nil {
			t.Fatalf("image %s: %v", ref, err)
		}
	}
	n.Timings.Images = time.Since(t0)
	t0 = time.Now()
	n.sysctls = readSysctls()
	if err := n.startWatchdog(); err != nil {
		t.Fatalf("watchdog: %v", err)
	}
	if err := n.startKubelet(kubelet); err != nil {
		t.Fatalf("kubelet: %v", err)
	}
	n.Timings.Kubelet = time.Since(t0)
	t0 = time.Now()
	if err := n.waitReady(); err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
	n.Timings.Ready = time.Since(t0)
	if err := n.untaintReady(); err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
	t.Logf("realnode: node %s Ready (build %s, containerd %s, images %s, kubelet start %s, Ready after %s); logs in %s",
		n.Name, n.Timings.Build.Round(time.Millisecond), n.Timings.Containerd.Round(time.Millisecond),
		n.Timings.Images.Round(time.Millisecond), n.Timings.Kubelet.Round(time.Millisecond),
		n.Timings.Ready.Round(time.Millisecond), dir)
	return n
}

// Check says what this machine lacks for a real node, or nil.
func Check() error {
	var missing []string
	if os.Geteuid() != 0 {
		return errors.New("a real kubelet and containerd need root")
	}
	for _, b := range []string{"containerd", "ctr", "runc", "ip"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(CNIBinDir, p))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run `bash %s` (Debian's containerd, runc, containernetworking-plugins, iproute2)",
			strings.Join(missing, ", "), EnsureScript)
	}
	return nil
}

// lock takes the machine-wide lock for the test, waiting for another
// test's node to end.
func lock(t testing.TB) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(Lock), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(Lock, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		holder, _ := os.ReadFile(Lock)
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Since(start) > lockTimeout {
			_ = f.Close()
			t.Fatalf("realnode: lock %s (held by pid %s): %v", Lock, strings.TrimSpace(string(holder)), err)
		}
		if time.Since(start) < time.Second {
			t.Logf("realnode: waiting for the machine's real kubelet: %s is held by pid %s", Lock, strings.TrimSpace(string(holder)))
		}
		time.Sleep(time.Second)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("realnode: waited %s for %s", d.Round(time.Second), Lock)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	t.Cleanup(func() {
		_ = f.Truncate(0)
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	})
}

// moduleRoot is the directory of the project's go.mod, above the working
// directory.
func moduleRoot() (string, error) {
	script, err := kubetest.FindScript()
	if err != nil {
		return "", err
	}
	return filepath.Dir(filepath.Dir(script)), nil
}

// kubeletBinary builds (or finds cached) the kubelet through the harness
// script and returns its path.
func kubeletBinary(t testing.TB, root string) string {
	t.Helper()
	if p := os.Getenv("KUBE_TEST_KUBELET_BIN"); p != "" {
		return p
	}
	cmd := exec.Command("bash", filepath.Join(root, kubetest.Script), "build", "--with-kubelet")
	cmd.Stderr = os.Stderr // build progress: the first build takes minutes
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s build --with-kubelet: %v", kubetest.Script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// containerdConfig: version 2 (containerd 1.6/1.7); everything under the
// node's directory, pods' network namespaces included
// (netns_mounts_under_state_dir), but the shims' sockets
// (/run/containerd/s, named by a hash of this socket's address).
// restrict_oom_score_adj: these machines' root lacks CAP_SYS_RESOURCE in
// its bounding set, so no process may lower its oom_score_adj below 0, and
// the kubelet asks -998 for every pod sandbox (and -997 for Guaranteed
// containers): runc init died with "failed to update
// /proc/self/oom_score_adj: Permission denied", which containerd reports
// as "can't get final child's PID from pipe: EOF". The option clamps the
// value to containerd's own.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  enable_selinux = false
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
`

// cniConfig: a bridge of the node's own, no gateway, no masquerade (pods
// need no way out), addresses from host-local kept under the node's
// directory.
const cniConfig = `{
  "cniVersion": "0.4.0",
  "name": "realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": false,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": "10.233.0.0/24"}]]
      }
    },
    {"type": "loopback"}
  ]
}
`

func (n *Node) startContainerd() error {
	conf := filepath.Join(n.Dir, "containerd.toml")
	netd := filepath.Join(n.Dir, "net.d")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		return err
	}
	cni := fmt.Sprintf(cniConfig, n.bridge, filepath.Join(n.Dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(netd, "10-realnode.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	c := fmt.Sprintf(containerdConfig, filepath.Join(n.Dir, "containerd-root"), filepath.Join(n.Dir, "containerd-state"),
		n.containerd, n.containerd+".ttrpc", filepath.Join(n.Dir, "opt"), PauseImage, CNIBinDir, netd)
	if err := os.WriteFile(conf, []byte(c), 0o644); err != nil {
		return err
	}
	p, err := n.run("containerd", "containerd", "--config", conf)
	if err != nil {
		return err
	}
	return n.waitFor(p, 30*time.Second, func() bool {
		return exec.Command("ctr", "--address", n.containerd, "version").Run() == nil
	})
}

// importImage imports the program prog (built into Dir) as the image ref,
// its entrypoint.
func (n *Node) importImage(ref, prog string) error {
	files := []ImageFile{{Path: "/" + prog, Src: filepath.Join(n.Dir, prog), Mode: 0o755}}
	return n.ImportImage(ref, []string{"/" + prog}, files)
}

// ImportImage writes the image ref (files, entrypoint) as an OCI archive
// and imports it into the node's containerd, in the CRI's namespace
// (k8s.io), unpacked for overlayfs: pods on the node can run it with
// imagePullPolicy Never. BinaryFiles gives the files of a program.
func (n *Node) ImportImage(ref string, entrypoint []string, files []ImageFile) error {
	archive := filepath.Join(n.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".oci.tar")
	if err := WriteImage(archive, ref, entrypoint, files); err != nil {
		return err
	}
	return n.ctr("images", "import", archive)
}

// ctr runs containerd's client against the node's containerd, in the
// CRI's namespace.
func (n *Node) ctr(args ...string) error {
	out, err := exec.Command("ctr", append([]string{"--address", n.containerd, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// kubeletConfig: what the kubelet needs to run here, and no more.
//   - failCgroupV1: false: the machine has cgroup v1 (hybrid); from 1.35
//     the kubelet refuses v1 unless told.
//   - failSwapOn: false: no swap here, but the check reads /proc/swaps
//     and the test must not depend on it.
//   - cgroupsPerQOS: false, enforceNodeAllocatable: []: no kubepods
//     cgroup tree on the host's hierarchies.
//   - anonymous with AlwaysAllow: the server listens on 127.0.0.1 only;
//     the API server's pods/log and exec reach it without certificates.
//   - image GC off (100 %): the images were imported, not pulled; a GC
//     would lose them for good.
//   - eviction thresholds low: the test machine's disk and memory are
//     shared; pressure must not evict test pods.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
registerNode: true
`

func (n *Node) startKubelet(bin string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(kubeletConfig, port, n.containerd, n.podLogs)), 0o644); err != nil {
		return err
	}
	p, err := n.run("kubelet", bin, "--config", conf, "--kubeconfig", kubetest.Kubeconfig(),
		"--root-dir", n.kubeletRoot, "--hostname-override", n.Name, "--v", "2")
	if err != nil {
		return err
	}
	return n.waitFor(p, 60*time.Second, func() bool {
		_, err := n.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		return err == nil
	})
}

// waitReady waits for the Node's Ready condition.
func (n *Node) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	var last string
	for time.Now().Before(deadline) {
		node, err := n.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					last = c.Reason + ": " + c.Message
				}
			}
		}
		if p := n.proc("kubelet"); p != nil && p.done() {
			return fmt.Errorf("the kubelet exited: %v%s", p.err, n.tail(p))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not Ready after %s (last: %s)%s", readyTimeout, last, n.tail(n.proc("kubelet")))
}

// run starts a server with its output in Dir/name.log.
func (n *Node) run(name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, log: filepath.Join(n.Dir, name+".log"), exited: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// Its own process group: a ^C to the test does not reach it before
	// the cleanup stops it in order.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = f.Close()
		close(p.exited)
	}()
	n.procs = append(n.procs, p)
	// For the watchdog: what to stop if the test process dies.
	_ = os.WriteFile(filepath.Join(n.Dir, name+".pid"), []byte(strconv.Itoa(p.cmd.Process.Pid)), 0o644)
	return p, nil
}

// watchdogScript does what stop does, roughly, once the test process is
// gone without its cleanup (killed, or a crash): the kubelet, containerd's
// tasks and shims, containerd, the mounts, the bridge, the cgroups, the
// kernel settings, the checkpoint and the directory. Arguments: the test
// process's pid, Dir, containerd's socket, the bridge.
const watchdogScript = `owner=$1 dir=$2 sock=$3 bridge=$4
# alive PID: running and not a zombie (orphans' zombies are not reaped here).
alive() {
	local st
	st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [[ -n $st && $st != Z && $st != X ]]
}
while alive "$owner"; do sleep 1; done
[[ -d $dir ]] || exit 0
stop() {
	local f=$dir/$1.pid p
	[[ -f $f ]] || return 0
	p=$(<"$f")
	grep -qaF "$dir" "/proc/$p/cmdline" 2>/dev/null || return 0
	kill -TERM "$p"
	for _ in $(seq 75); do alive "$p" || return 0; sleep 0.2; done
	kill -KILL "$p"
}
stop kubelet
for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
	ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$id"
	ctr --address "$sock" -n k8s.io tasks delete -f "$id"
done
stop containerd
for c in /proc/[0-9]*/cmdline; do
	p=${c#/proc/} p=${p%/cmdline}
	# Not this script: its own command line names both.
	if [[ $p != "$$" ]] && grep -qa containerd-shim "$c" && grep -qaF "$sock" "$c"; then kill -KILL "$p"; fi
done 2>/dev/null
awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
ip link del "$bridge" 2>/dev/null
rmdir /sys/fs/cgroup/*/k8s.io 2>/dev/null
while read -r k v; do echo "$v" >"/proc/sys/$k"; done <"$dir/sysctls"
rm -f ` + checkpoint + `
rm -rf "$dir"
`

// startWatchdog starts a shell that cleans up after the test process if
// it dies without running stop; stop kills it first.
func (n *Node) startWatchdog() error {
	var b strings.Builder
	for k, v := range n.sysctls {
		fmt.Fprintf(&b, "%s %s\n", k, v)
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "sysctls"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("bash", "-c", watchdogScript, "realnode-watchdog",
		strconv.Itoa(os.Getpid()), n.Dir, n.containerd, n.bridge)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	n.watchdog = cmd
	go func() { _ = cmd.Wait() }()
	return nil
}

func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (n *Node) proc(name string) *proc {
	for _, p := range n.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// waitFor polls ok until it holds, p exits, or timeout passes.
func (n *Node) waitFor(p *proc, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ok() {
			return nil
		}
		if p.done() {
			return fmt.Errorf("%s exited at start: %v%s", p.name, p.err, n.tail(p))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not up after %s%s", p.name, timeout, n.tail(p))
}

// tail is the end of p's log, its warnings and errors first, for a failure
// message.
func (n *Node) tail(p *proc) string {
	if p == nil {
		return ""
	}
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	var bad []string
	for _, l := range lines {
		if strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W") || strings.Contains(l, "level=error") || strings.Contains(l, "level=warning") {
			bad = append(bad, l)
		}
	}
	bad = bad[max(0, len(bad)-25):]
	lines = lines[max(0, len(lines)-15):]
	return fmt.Sprintf("\n---- %s: its last warnings and errors:\n%s\n---- its last lines (%s):\n%s",
		p.name, strings.Join(bad, "\n"), p.log, strings.Join(lines, "\n"))
}

// PodResourcesSocket is the kubelet's own PodResources socket.
func (n *Node) PodResourcesSocket() string {
	return filepath.Join(n.kubeletRoot, "pod-resources", "kubelet.sock")
}

// DevicePluginDir is the kubelet's device-plugin directory (fixed in the
// kubelet): plugins serve their socket there and register at
// pluginapi.KubeletSocket.
func (n *Node) DevicePluginDir() string { return pluginapi.DevicePluginPath }

// ContainerLog returns what a container of a pod wrote so far, every
// restart's in order (the kubelet's pod log directory,
// podLogsDir/NS_NAME_UID/CONTAINER/RESTART.log, in CRI log format: time,
// stream, tag, line).
func (n *Node) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	dir := filepath.Join(n.podLogs, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID), container)
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no log of %s/%s container %s in %s", pod.Namespace, pod.Name, container, dir)
	}
	restart := func(f string) int {
		i, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(f), ".log"))
		return i
	}
	slices.SortFunc(files, func(a, b string) int { return restart(a) - restart(b) })
	var all strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return all.String(), err
		}
		all.Write(b)
	}
	return all.String(), nil
}

// Pod is a pod for the node: SleepImage, never pulled, bound by the
// scheduler named schedulerName ("" binds it to the node directly, as
// spec.nodeName).
func (n *Node) Pod(ns, name, schedulerName string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "sleep", Image: SleepImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{name},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			NodeSelector:                  map[string]string{corev1.LabelHostname: n.Name},
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	if schedulerName == "" {
		p.Spec.NodeName = n.Name
	} else {
		p.Spec.SchedulerName = schedulerName
	}
	return p
}

// stop ends everything Start started, in order: the pods (through the
// kubelet, so that containerd tears their sandboxes and networks down),
// the kubelet, any task left, containerd and its shims; then it unmounts
// what is left under Dir, deletes the bridge, the Node object and Dir, and puts the kernel settings
// back. A failed test first gets the logs' tails.
func (n *Node) stop() {
	t := n.t
	if n.watchdog != nil {
		_ = n.watchdog.Process.Kill()
	}
	if t.Failed() {
		for _, p := range n.procs {
			t.Logf("realnode: %s", n.tail(p))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if kl := n.proc("kubelet"); kl != nil && !kl.done() {
		if err := n.deletePods(ctx); err != nil {
			t.Logf("realnode: deleting the node's pods: %v", err)
		}
		n.waitTasksGone(ctx)
	}
	for _, name := range []string{"kubelet", "containerd"} {
		p := n.proc(name)
		if p == nil {
			continue
		}
		if name == "containerd" {
			n.killTasks()
		}
		if !p.done() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(15 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
		}
	}
	n.killShims()
	for _, m := range n.mountsLeft() {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			t.Logf("realnode: unmount %s: %v", m, err)
		}
	}
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
	// containerd's default cgroup parent for the CRI's namespace (the
	// kubelet gives none without cgroupsPerQOS): removed when empty.
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, d := range dirs {
		_ = os.Remove(d)
	}
	writeSysctls(t, n.sysctls)
	_ = os.Remove(checkpoint)
	if err := n.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("realnode: delete node %s: %v", n.Name, err)
	}
	if os.Getenv("REALNODE_KEEP_DIR") == "1" {
		t.Logf("realnode: REALNODE_KEEP_DIR=1: kept %s", n.Dir)
		return
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		t.Logf("realnode: remove %s: %v", n.Dir, err)
	}
}

// deletePods deletes every pod bound to the node at once and waits until
// the kubelet has stopped them and they are gone.
func (n *Node) deletePods(ctx context.Context) error {
	sel := fields.OneTermEqualSelector("spec.nodeName", n.Name).String()
	for {
		pods, err := n.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			return nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				err := n.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				if err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d pods still on the node: %w", len(pods.Items), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitTasksGone waits until containerd runs no task: the kubelet stops the
// containers and sandboxes of pods deleted from the API (also those a
// test's namespace cleanup force-deleted) on its own.
func (n *Node) waitTasksGone(ctx context.Context) {
	for {
		out, err := exec.Command("ctr", "--address", n.containerd, "--namespace", "k8s.io", "tasks", "ls").Output()
		if err != nil || !strings.Contains(string(out), "RUNNING") {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// killTasks kills and deletes what containerd still runs in the CRI's
// namespace (after the kubelet, nothing should be left).
func (n *Node) killTasks() {
	out, err := exec.Command("ctr", "--address", n.containerd, "--namespace", "k8s.io", "tasks", "ls", "-q").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		n.t.Logf("realnode: task %s still there after the kubelet: killed", id)
		_ = n.ctr("tasks", "kill", "--signal", "SIGKILL", id)
		_ = n.ctr("tasks", "delete", "--force", id)
	}
}

// killShims kills the runc shims of the node's containerd still running:
// their command line names its socket address.
func (n *Node) killShims() {
	pids, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range pids {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "containerd-shim") || !strings.Contains(string(b), n.containerd) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil {
			n.t.Logf("realnode: shim %d still running: killed", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// mountsLeft lists the mount points under Dir (pods' network namespaces
// included), deepest first.
func (n *Node) mountsLeft() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		mp := unescape(fs[4])
		if strings.HasPrefix(mp, n.Dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(out)
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// kernelSettings are the sysctls the kubelet sets at start
// (pkg/kubelet/cm/container_manager_linux.go setupKernelTunables, unless
// protectKernelDefaults, which fails on a machine that differs): put back
// at the test's end.
var kernelSettings = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

func readSysctls() map[string]string {
	m := map[string]string{}
	for _, k := range kernelSettings {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			m[k] = strings.TrimSpace(string(b))
		}
	}
	return m
}

func writeSysctls(t testing.TB, m map[string]string) {
	for k, v := range m {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil && strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			t.Logf("realnode: restore %s=%s: %v", k, v, err)
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randSuffix() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// untaintReady removes node.kubernetes.io/not-ready:NoSchedule from the
// Ready node, as kube-controller-manager's node lifecycle controller does
// (pkg/controller/nodelifecycle, doNoScheduleTaintingPass): the API
// server's TaintNodesByCondition admission puts it on every new Node, and
// the tests' controller manager runs no node lifecycle controller. Without
// this, a DaemonSet whose pods tolerate only their own taints (the GPU
// Operator's device plugin) has DesiredNumberScheduled 0 on the node.
func (n *Node) untaintReady() error {
	ctx := context.Background()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kept := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(x corev1.Taint) bool {
			return x.Key == corev1.TaintNodeNotReady && x.Effect == corev1.TaintEffectNoSchedule
		})
		if len(kept) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = kept
		_, err = n.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
}
