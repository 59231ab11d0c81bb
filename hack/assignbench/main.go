// Command assignbench measures what the assignment trail costs on an idle
// node whose pods churn (`make bench`): one agent on simulated H200x8 in
// all-1g.18gb (56 MIG devices), 50 pods on MIG devices, one replaced by a
// new pod every -churn-every, for -window with the trail on
// (--assignment-interval, default 10s) and again with it off (0). It counts
// the agent's API requests from the API server's audit log (user agent
// mig-agent/), its CPU time (/proc/PID/stat), and the PodResources List
// calls the kubelet stand-in served, per minute; it prints them and merges
// them into bench-results.json under "assignments". See docs/bench.md.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/benchfile"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

const (
	sim      = "sim:h200x8"
	config   = "all-1g.18gb"
	node     = "bench-trail"
	agentNS  = "mig-agent"
	podNS    = "ml"
	resource = "nvidia.com/mig-1g.18gb"
)

// phase is one measured window.
type phase struct {
	AssignmentInterval string         `json:"assignmentInterval"`
	WindowSeconds      float64        `json:"windowSeconds"`
	PodStartsPerMin    float64        `json:"podStartsPerMin"`
	RequestsPerMin     float64        `json:"apiRequestsPerMin"`
	Requests           map[string]int `json:"apiRequests"`
	CPUSecondsPerMin   float64        `json:"cpuSecondsPerMin"`
	ListCallsPerMin    float64        `json:"podResourcesListPerMin"`
	HistoryEntries     int            `json:"historyEntries,omitempty"`
}

// results is the "assignments" key of bench-results.json.
type results struct {
	Date       string  `json:"date"`
	Pods       int     `json:"pods"`
	ChurnEvery string  `json:"churnEvery"`
	On         phase   `json:"trailOn"`
	Off        phase   `json:"trailOff"`
	CPUs       int     `json:"cpus"`
	LoadAvg    float64 `json:"loadAvgBefore"`
}

type options struct {
	agent, out         string
	pods               int
	churnEvery, window time.Duration
	interval           time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.agent, "agent", "bin/mig-agent", "the mig-agent binary to measure")
	flag.StringVar(&o.out, "o", "bench-results.json", "results file (merged under \"assignments\")")
	flag.IntVar(&o.pods, "pods", 50, "pods on MIG devices (at most 55: one device stays free for the churn)")
	flag.DurationVar(&o.churnEvery, "churn-every", 2*time.Second, "one pod is replaced by a new one this often")
	flag.DurationVar(&o.window, "window", 2*time.Minute, "how long each phase is measured")
	flag.DurationVar(&o.interval, "assignment-interval", 10*time.Second, "the agent's --assignment-interval with the trail on")
	flag.Parse()
	tb := &kubetest.Runner{Name: "kubelet stand-in"}
	err := run(context.Background(), o, tb)
	tb.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "assignbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, tb *kubetest.Runner) (err error) {
	defer kubetest.Recover(&err)
	if o.pods < 1 || o.pods > 55 {
		return fmt.Errorf("-pods %d: want 1 to 55", o.pods)
	}
	bin, err := filepath.Abs(o.agent)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "mig-agent-assignbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	simState := filepath.Join(work, "sim.json")
	if out, err := exec.Command(bin, "apply", "-c", config, "--nvml", sim, "--sim-state", simState, "--log-level", "error").CombinedOutput(); err != nil {
		return fmt.Errorf("apply: %w: %s", err, out)
	}
	uuids, err := migUUIDs(bin, simState)
	if err != nil {
		return err
	}
	// Every request in the audit log, so the agent's are counted by its
	// user agent apart from the bench's own.
	os.Setenv("KUBE_TEST_AUDIT", "all")
	start := exec.CommandContext(ctx, "bash", "hack/kube-apiserver.sh", "start", "--owner-pid", fmt.Sprint(os.Getpid()))
	start.Stderr = os.Stderr
	out, err := start.Output()
	if err != nil {
		return fmt.Errorf("starting the API server: %w", err)
	}
	kubeconfig := strings.TrimSpace(string(out))
	defer func() { _ = exec.Command("bash", "hack/kube-apiserver.sh", "stop", filepath.Dir(kubeconfig)).Run() }()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, ns := range []string{agentNS, podNS} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels: map[string]string{record.LabelConfig: config}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	kl := kubetest.StartKubelet(tb, c, node)
	r := &results{Date: time.Now().UTC().Format(time.RFC3339), Pods: o.pods, ChurnEvery: o.churnEvery.String(), CPUs: runtime.NumCPU(), LoadAvg: benchfile.LoadAvg()}
	ch := &churn{c: c, kl: kl, tb: tb, free: uuids}
	for range o.pods {
		ch.start()
	}
	for i, interval := range []time.Duration{o.interval, 0} {
		p, err := measure(ctx, o, bin, kubeconfig, simState, filepath.Join(work, fmt.Sprintf("state-%d", i)), interval, c, kl, ch)
		if err != nil {
			return err
		}
		if interval > 0 {
			r.On = *p
		} else {
			r.Off = *p
		}
	}
	printResults(r)
	return merge(o.out, r)
}

// measure runs the agent with interval and the churn for the window.
func measure(ctx context.Context, o options, bin, kubeconfig, simState, stateDir string, interval time.Duration,
	c kubernetes.Interface, kl *kubetest.Kubelet, ch *churn) (*phase, error) {
	fmt.Fprintf(os.Stderr, "assignbench: %d pods, one replaced every %s, --assignment-interval %s, for %s\n", o.pods, o.churnEvery, interval, o.window)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	agent := exec.Command(bin, "run", "--node-name", node, "--kubeconfig", kubeconfig, "--namespace", agentNS,
		"--nvml", sim, "--sim-state", simState, "--state-dir", stateDir, "--metrics-address", addr,
		"--reboot-method", "none", "--pod-resources-socket", kl.Socket(), "--assignment-interval", interval.String(),
		"--log-level", "warn")
	var log bytes.Buffer
	agent.Stdout, agent.Stderr = &log, &log
	if err := agent.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = agent.Process.Signal(os.Interrupt); _ = agent.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil && n.Labels[record.LabelState] == record.StateSuccess {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the agent did not reach success:\n%s", log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Let the trail take in the pods already there.
	time.Sleep(interval + 2*time.Second)
	from, cpu0, lists0, starts0 := time.Now(), cpuSeconds(agent.Process.Pid), kl.ListCalls(), ch.starts
	tick := time.NewTicker(o.churnEvery)
	for time.Since(from) < o.window {
		<-tick.C
		ch.replace(ctx)
	}
	tick.Stop()
	to := time.Now()
	took := to.Sub(from).Minutes()
	p := &phase{AssignmentInterval: interval.String(), WindowSeconds: to.Sub(from).Seconds(), Requests: map[string]int{},
		CPUSecondsPerMin: (cpuSeconds(agent.Process.Pid) - cpu0) / took, ListCallsPerMin: float64(kl.ListCalls()-lists0) / took,
		PodStartsPerMin: float64(ch.starts-starts0) / took}
	time.Sleep(time.Second) // the audit log is written when a response completes
	evs, err := audit.Read(audit.LogPath(filepath.Dir(kubeconfig)), from, to, audit.ByUserAgent("mig-agent/"))
	if err != nil {
		return nil, err
	}
	total := 0
	for _, e := range evs {
		if e.Verb == "watch" {
			continue // the node watch, held open
		}
		p.Requests[e.Verb+" "+e.Resource()]++
		total++
	}
	p.RequestsPerMin = float64(total) / took
	if interval > 0 {
		cm, err := c.CoreV1().ConfigMaps(agentNS).Get(ctx, node+"-mig-assignments", metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("the trail's ConfigMap: %w", err)
		}
		var h struct {
			Entries []json.RawMessage `json:"entries"`
		}
		if err := json.Unmarshal([]byte(cm.Data["history.json"]), &h); err != nil {
			return nil, err
		}
		p.HistoryEntries = len(h.Entries)
	}
	return p, nil
}

// churn keeps pods on MIG devices and replaces the oldest with a new one.
type churn struct {
	c      kubernetes.Interface
	kl     *kubetest.Kubelet
	tb     *kubetest.Runner
	free   []string
	pods   []*corev1.Pod
	device map[string]string // pod name → device
	n      int
	starts int
}

func (ch *churn) start() {
	if ch.device == nil {
		ch.device = map[string]string{}
	}
	dev := ch.free[0]
	ch.free = ch.free[1:]
	ch.n++
	name := fmt.Sprintf("job-%d", ch.n)
	p := ch.kl.RunPod(ch.tb, podNS, name, map[string]string{resource: "1"}, map[string][]string{resource: {dev}}, nil)
	ch.pods = append(ch.pods, p)
	ch.device[name] = dev
	ch.starts++
}

func (ch *churn) replace(ctx context.Context) {
	old := ch.pods[0]
	ch.pods = ch.pods[1:]
	_ = ch.c.CoreV1().Pods(podNS).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	ch.start()
	ch.free = append(ch.free, ch.device[old.Name])
	delete(ch.device, old.Name)
}

// migUUIDs lists the MIG device UUIDs of the simulated GPUs.
func migUUIDs(bin, simState string) ([]string, error) {
	out, err := exec.Command(bin, "profiles", "-o", "json", "--nvml", sim, "--sim-state", simState, "--log-level", "error").Output()
	if err != nil {
		return nil, fmt.Errorf("profiles: %w", err)
	}
	var doc struct {
		GPUs []struct {
			Instances []struct {
				UUID string `json:"uuid"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, err
	}
	var ids []string
	for _, g := range doc.GPUs {
		for _, in := range g.Instances {
			ids = append(ids, in.UUID)
		}
	}
	return ids, nil
}

// cpuSeconds is the process's user and system CPU time (/proc/PID/stat,
// fields 14 and 15, in clock ticks of 1/100 s).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100
}

func printResults(r *results) {
	fmt.Printf("\nassignment trail: %d pods on MIG devices, one replaced every %s (%d CPUs, load %.1f)\n", r.Pods, r.ChurnEvery, r.CPUs, r.LoadAvg)
	for _, p := range []phase{r.On, r.Off} {
		keys := make([]string, 0, len(p.Requests))
		for k := range p.Requests {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, p.Requests[k]))
		}
		fmt.Printf("  --assignment-interval %-4s pod starts/min %5.1f  agent API requests/min %6.1f  CPU s/min %5.2f  PodResources List/min %5.1f  history entries %d  (%s)\n",
			p.AssignmentInterval, p.PodStartsPerMin, p.RequestsPerMin, p.CPUSecondsPerMin, p.ListCallsPerMin, p.HistoryEntries, strings.Join(parts, ", "))
	}
}

// merge writes r under "assignments" of the results file, keeping its other
// keys.
func merge(path string, r *results) error { return benchfile.MergeKey(path, "assignments", r) }
