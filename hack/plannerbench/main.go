// Command plannerbench measures the planner end to end (`make bench`): a
// real kube-apiserver with etcd and the DaemonSet controller
// (hack/kube-apiserver.sh, every request in its audit log), the real
// kube-scheduler (the tests' profile, kubetest.SchedulerConfig), the real
// `mig-agent planner` and, per repeat, a fresh opted-in node of simulated
// H200s with MIG off, its real agent and the tests' device plugin stand-in
// (kubetest.StartDevicePlugin). Each repeat creates one pod asking for
// nvidia.com/mig-3g.71gb, which no node offers, and times it from its
// creation to its binding by the scheduler, through the planner's change
// and the agent's, and the planner's own latency: from the pod marked
// unschedulable to the label set (the nodes have no GPU Feature
// Discovery labels: the planner reads the GPUs their agents publish); it counts the planner's API requests in that window
// (the audit log's requests with the user agent mig-agent-planner/) and its
// decisions (its metrics). After the repeats it counts the planner's
// requests over an idle window. It prints the figures and merges them into
// bench-results.json under "planner". See docs/bench.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/benchfile"
	"github.com/migagent/mig-agent/testkit/kubetest"
	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

const (
	agentNS   = "mig-agent"
	pluginNS  = "gpu-operator"
	podNS     = "ml"
	profile   = "3g.71gb"
	userAgent = "mig-agent-planner/"
	// configs are the configs of the bench's nodes; the planner may choose
	// all-1g.18gb or all-3g.71gb.
	configs = `version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.18gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.18gb: 7
  all-3g.71gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        3g.71gb: 2
`
	allowed = "all-1g.18gb,all-3g.71gb"
)

type options struct {
	agent, out, sim string
	logLevel        string
	keep            bool
	repeats         int
	interval, idle  time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.agent, "agent", "bin/mig-agent", "the mig-agent binary (agents and planner)")
	flag.StringVar(&o.out, "o", "bench-results.json", "results file (merged under \"planner\")")
	flag.StringVar(&o.sim, "sim", "h200x1", "each node's simulated GPUs (--nvml sim:SPEC)")
	flag.IntVar(&o.repeats, "repeats", 5, "pods timed, each on a fresh node")
	flag.DurationVar(&o.interval, "planner-interval", 5*time.Second, "the planner's --planner-interval (its default: 5s)")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "how long the planner's idle requests are counted")
	flag.StringVar(&o.logLevel, "log-level", "warn", "the agents' and the planner's --log-level (their logs are in the work dir)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work dir (the processes' logs) and print its path")
	flag.Parse()
	err := run(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plannerbench:", err)
		os.Exit(1)
	}
}

// bench is what the repeats share.
type bench struct {
	o          options
	bin, work  string
	kubeconfig string
	cfgFile    string
	c          kubernetes.Interface
	metrics    string // the planner's /metrics URL
}

func run(ctx context.Context, o options) (err error) {
	defer kubetest.Recover(&err)
	if o.repeats < 1 {
		return fmt.Errorf("-repeats %d: want at least 1", o.repeats)
	}
	b := &bench{o: o}
	if b.bin, err = filepath.Abs(o.agent); err != nil {
		return err
	}
	if b.work, err = os.MkdirTemp("", "mig-agent-plannerbench-"); err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "plannerbench: work dir", b.work)
	} else {
		defer os.RemoveAll(b.work)
	}
	b.cfgFile = filepath.Join(b.work, "config.yaml")
	if err := os.WriteFile(b.cfgFile, []byte(configs), 0o600); err != nil {
		return err
	}
	// Every request in the audit log: the planner's are told by its user
	// agent.
	os.Setenv("KUBE_TEST_AUDIT", "all")
	start := exec.CommandContext(ctx, "bash", kubetest.Script, "start", "--with-controller-manager="+kubetest.Controllers,
		"--owner-pid", fmt.Sprint(os.Getpid()))
	start.Stderr = os.Stderr
	out, err := start.Output()
	if err != nil {
		return fmt.Errorf("starting the API server: %w", err)
	}
	b.kubeconfig = strings.TrimSpace(string(out))
	defer func() { _ = exec.Command("bash", kubetest.Script, "stop", filepath.Dir(b.kubeconfig)).Run() }()
	cfg, err := clientcmd.BuildConfigFromFlags("", b.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400
	if b.c, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	for _, ns := range []string{agentNS, pluginNS, podNS} {
		if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	stopScheduler, err := b.startScheduler()
	if err != nil {
		return err
	}
	defer stopScheduler()
	stopPlanner, err := b.startPlanner(ctx)
	if err != nil {
		return err
	}
	defer stopPlanner()
	r := &results{Date: time.Now().UTC().Format(time.RFC3339), Sim: "sim:" + o.sim, PlannerInterval: o.interval.String(),
		CPUs: runtime.NumCPU(), LoadAvgBefore: benchfile.LoadAvg()}
	for i := range o.repeats {
		rep, err := b.repeat(ctx, i)
		if err != nil {
			return fmt.Errorf("repeat %d: %w", i+1, err)
		}
		fmt.Fprintf(os.Stderr, "plannerbench: repeat %d: created → bound %.0f ms, planner requests %d, decisions %d\n",
			i+1, rep.CreatedToBoundMs, rep.APIRequestsTotal, rep.Decisions)
		r.Repeats = append(r.Repeats, rep)
	}
	if r.IdleRequests, r.IdleAPIRequestsPerMin, err = b.idle(); err != nil {
		return err
	}
	r.LoadAvgAfter = benchfile.LoadAvg()
	r.summarize()
	r.print(os.Stdout)
	return merge(o.out, r)
}

// startScheduler runs the real kube-scheduler the tests run (its binary
// from the harness's cache, built there once).
func (b *bench) startScheduler() (func(), error) {
	cmd := exec.Command("bash", kubetest.Script, "build", "--with-scheduler")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s build --with-scheduler: %w", kubetest.Script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	bin := lines[len(lines)-1]
	cfg := filepath.Join(b.work, "scheduler.yaml")
	if err := os.WriteFile(cfg, []byte(kubetest.SchedulerConfig(b.kubeconfig)), 0o600); err != nil {
		return nil, err
	}
	return b.startProcess(bin, "kube-scheduler", "--config", cfg, "--secure-port", "0", "--leader-elect=false")
}

// startPlanner runs `mig-agent planner` and waits until it leads.
func (b *bench) startPlanner(ctx context.Context) (func(), error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	b.metrics = "http://" + addr + "/metrics"
	stop, err := b.startProcess(b.bin, "planner", "planner", "--kubeconfig", b.kubeconfig, "--namespace", agentNS, "-f", b.cfgFile,
		"--allowed-configs", allowed, "--planner-interval", b.o.interval.String(), "--max-concurrent", "1",
		"--metrics-address", addr, "--log-level", b.o.logLevel)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m, err := scrape(b.metrics); err == nil && metricValue(m, "migagent_planner_leader") == 1 {
			return stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("the planner did not take the Lease within 60 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startProcess starts bin with args, its output in the work dir's
// name.log, and returns its stop (SIGTERM, then SIGKILL after 15 s).
func (b *bench) startProcess(bin, name string, args ...string) (func(), error) {
	logPath := filepath.Join(b.work, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		f.Close()
		log, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%s exited at start:\n%s", name, tail(string(log), 40))
	case <-time.After(time.Second):
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		f.Close()
	}, nil
}

// repeat times one pod on a fresh node: created → unschedulable → label
// set by the planner → the agent's success → bound.
func (b *bench) repeat(ctx context.Context, i int) (rep repeat, err error) {
	tb := &kubetest.Runner{Name: "device plugin stand-in"}
	defer tb.Close()
	node := fmt.Sprintf("bench-planner-%d", i+1)
	if err := b.newNode(ctx, node); err != nil {
		return rep, err
	}
	defer func() { _ = b.c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) }()
	simState := filepath.Join(b.work, node+"-sim.json")
	addr, err := freeAddr()
	if err != nil {
		return rep, err
	}
	stopAgent, err := b.startProcess(b.bin, node+"-agent", "run", "--node-name", node, "--kubeconfig", b.kubeconfig,
		"--namespace", agentNS, "--nvml", "sim:"+b.o.sim, "--sim-state", simState, "--state-dir", filepath.Join(b.work, node+"-state"),
		"--metrics-address", addr, "--reboot-method", "none", "-f", b.cfgFile, "--assignment-interval", "0",
		"--pod-resources-socket", filepath.Join(b.work, "no-kubelet.sock"), "--log-level", b.o.logLevel)
	if err != nil {
		return rep, err
	}
	defer stopAgent()
	dp := kubetest.StartDevicePlugin(tb, b.c, node, pluginNS, "mixed", b.pluginReader(simState))
	if err := waitFor(60*time.Second, "the device plugin pod to run", dp.Counted); err != nil {
		return rep, err
	}
	if err := waitFor(30*time.Second, "the agent to be ready", func() bool { return ready("http://" + addr + "/readyz") }); err != nil {
		return rep, err
	}
	if err := waitFor(30*time.Second, "the agent's published GPUs", func() bool {
		cm, err := b.c.CoreV1().ConfigMaps(agentNS).Get(ctx, node+"-mig-config", metav1.GetOptions{})
		return err == nil && cm.Annotations[record.AnnotationGPUs] != ""
	}); err != nil {
		return rep, err
	}
	before, err := scrape(b.metrics)
	if err != nil {
		return rep, err
	}
	tr := &tracker{c: b.c, node: node, pod: fmt.Sprintf("big-%d", i+1)}
	stop := tr.watch(ctx)
	defer stop()
	created := time.Now()
	if err := b.createPod(ctx, tr.pod); err != nil {
		return rep, err
	}
	defer func() {
		_ = b.c.CoreV1().Pods(podNS).Delete(context.Background(), tr.pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}()
	if err := waitFor(180*time.Second, "pod "+tr.pod+" bound", tr.bound); err != nil {
		return rep, fmt.Errorf("%w (%s)", err, tr.String())
	}
	bound := tr.times().bound
	// The scheduler binds once the plugin's devices are in the Node's
	// allocatable; the agent writes success once it has seen them there
	// too, so success may come just after the binding.
	_ = waitFor(30*time.Second, "the agent's success", func() bool { return !tr.times().success.IsZero() })
	time.Sleep(time.Second) // the audit log is written as responses complete
	evs, err := audit.Read(audit.LogPath(filepath.Dir(b.kubeconfig)), created, bound, audit.ByUserAgent(userAgent))
	if err != nil {
		return rep, err
	}
	after, err := scrape(b.metrics)
	if err != nil {
		return rep, err
	}
	t := tr.times()
	rep = repeat{Node: node, CreatedToUnschedulableMs: ms(t.unschedulable.Sub(created)), CreatedToLabelMs: ms(t.label.Sub(created)),
		UnschedulableToLabelMs: ms(t.label.Sub(t.unschedulable)),
		CreatedToSuccessMs:     ms(t.success.Sub(created)), CreatedToBoundMs: ms(bound.Sub(created)),
		Decisions: int(decisions(after) - decisions(before))}
	rep.APIRequests, rep.APIRequestsTotal = countRequests(evs)
	if t.label.IsZero() || t.success.IsZero() {
		return rep, fmt.Errorf("pod bound without the planner's change on %s (%s)", node, tr.String())
	}
	return rep, nil
}

// newNode creates an opted-in node of the bench's GPUs, without GPU
// Feature Discovery's labels (the planner reads the GPUs its agent
// publishes), and reports its pods, CPU and memory (the scheduler's other
// fits).
func (b *bench) newNode(ctx context.Context, node string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{
		"migagent.io/planner": "enabled", "nvidia.com/mig.strategy": "mixed"}}}
	if _, err := b.c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := b.c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		res := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
			corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi")}
		n.Status.Capacity, n.Status.Allocatable = res, res
		_, err = b.c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// createPod creates a pod of the test scheduler asking for one MIG device
// of the bench's profile.
func (b *bench) createPod(ctx context.Context, name string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: name},
		Spec: corev1.PodSpec{SchedulerName: kubetest.SchedulerName, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: kubetest.PodContainer, Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceName("nvidia.com/mig-" + profile): resource.MustParse("1")}}}}}}
	_, err := b.c.CoreV1().Pods(podNS).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// pluginReader enumerates the node's simulated GPUs as the device plugin
// stand-in sees them: one device per MIG device, named by its profile.
func (b *bench) pluginReader(simState string) func() ([]kubetest.PluginGPU, error) {
	return func() ([]kubetest.PluginGPU, error) {
		out, err := exec.Command(b.bin, "profiles", "-o", "json", "--nvml", "sim:"+b.o.sim, "--sim-state", simState, "--log-level", "error").Output()
		if err != nil {
			return nil, fmt.Errorf("profiles: %w", err)
		}
		return kubetest.PluginGPUsOf(out)
	}
}

// idle counts the planner's requests over the idle window (no pending pod).
func (b *bench) idle() (map[string]int, float64, error) {
	fmt.Fprintf(os.Stderr, "plannerbench: the planner idle for %s\n", b.o.idle)
	from := time.Now()
	time.Sleep(b.o.idle)
	to := time.Now()
	time.Sleep(time.Second)
	evs, err := audit.Read(audit.LogPath(filepath.Dir(b.kubeconfig)), from, to, audit.ByUserAgent(userAgent))
	if err != nil {
		return nil, 0, err
	}
	byKind, total := countRequests(evs)
	return byKind, float64(total) / to.Sub(from).Minutes(), nil
}

func scrape(url string) (string, error) {
	resp, err := http.Get(url) //nolint:noctx // loopback, short
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func ready(url string) bool {
	resp, err := http.Get(url) //nolint:noctx // loopback, short
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func decisions(metrics string) float64 {
	return metricValue(metrics, `migagent_planner_decisions_total{result="changed"}`)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitFor(d time.Duration, what string, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// merge writes r under "planner" of the results file, keeping its other
// keys.
func merge(path string, r *results) error { return benchfile.MergeKey(path, "planner", r) }
