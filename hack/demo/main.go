// Command demo shows what mig-agent is for, on one machine with no GPU: a
// node whose two (simulated) H200 GPUs are carved into MIG devices that pods
// use, a change of ONE GPU, and a live table of which pods stay and which
// are evicted, and why. It runs a real etcd + kube-apiserver on loopback
// (hack/kube-apiserver.sh), the kubelet stand-in of the tests
// (testkit/kubetest: PodResources over gRPC on a unix socket, evicted pods
// finished), and the built agent (bin/mig-agent). `make demo` runs it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest"
)

const (
	node      = "gpu-node-1"
	podNS     = "ml-team"
	agentNS   = "mig-agent"
	sim       = "sim:h200x2"
	before    = "all-balanced"
	after     = "gpu1-small-slices"
	configYML = `version: v1
mig-configs:
  # GPU 0 keeps the balanced split; GPU 1 trades its 2g.35gb for two more
  # 1g.18gb slices and keeps the rest.
  ` + after + `:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
`
)

func main() {
	bin := flag.String("bin", "bin/mig-agent", "mig-agent binary")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin, time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, a ...any) { fmt.Printf("==> "+format+"\n", a...) }

// pod is one row of the table.
type pod struct {
	name, uuid, device string // device: "2g.35gb@0"
	profile            string
	gpu, start         int
	evict              bool   // what the dry run says
	why                string // and why
	now                string // as seen on the API server
}

func run(ctx context.Context, bin string, t0 time.Time) (err error) {
	work, err := os.MkdirTemp("", "mig-agent-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tb := &kubetest.Runner{Name: "kubelet stand-in"}
	defer tb.Close()
	defer kubetest.Recover(&err)
	simState, cfgFile := filepath.Join(work, "sim-state.json"), filepath.Join(work, "mig-config.yaml")
	if err := os.WriteFile(cfgFile, []byte(configYML), 0o644); err != nil {
		return err
	}
	agentCmd := func(args ...string) ([]byte, error) {
		c := exec.CommandContext(ctx, bin, append(args, "--nvml", sim, "--sim-state", simState, "--log-level", "error")...)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		out, err := c.Output()
		if err != nil {
			return nil, fmt.Errorf("mig-agent %s: %w: %s", args[0], err, stderr.Bytes())
		}
		return out, nil
	}
	if _, err := agentCmd("apply", "-c", before); err != nil {
		return err
	}

	start := exec.CommandContext(ctx, "bash", "hack/kube-apiserver.sh", "start", "--owner-pid", fmt.Sprint(os.Getpid()))
	var startErr bytes.Buffer
	start.Stderr = &startErr
	t := time.Now()
	out, err := start.Output()
	if err != nil {
		return fmt.Errorf("starting the API server: %w: %s", err, startErr.Bytes())
	}
	kubeconfig := strings.TrimSpace(string(out))
	defer func() { _ = exec.Command("bash", "hack/kube-apiserver.sh", "stop", kubeconfig).Run() }()
	say("etcd + kube-apiserver on loopback: ready in %.1fs", time.Since(t).Seconds())

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, ns := range []string{agentNS, podNS} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := setLabel(ctx, c, before); err != nil {
		return err
	}

	// One pod on every MIG device, registered with the kubelet stand-in's
	// PodResources as the device plugin's allocation (resource
	// nvidia.com/mig-<profile>, device id the MIG device UUID).
	geo, err := readGeometry(agentCmd)
	if err != nil {
		return err
	}
	kubelet := kubetest.StartKubelet(tb, c, node)
	var pods []*pod
	for _, in := range geo {
		p := &pod{name: fmt.Sprintf("gpu%d-%s-at%d", in.gpu, strings.ReplaceAll(in.profile, ".", "-"), in.start),
			uuid: in.uuid, device: fmt.Sprintf("%s@%d", in.profile, in.start), profile: in.profile, gpu: in.gpu, start: in.start, now: "Running"}
		res := "nvidia.com/mig-" + in.profile
		kubelet.RunPod(tb, podNS, p.name, map[string]string{res: "1"}, map[string][]string{res: {in.uuid}}, nil)
		pods = append(pods, p)
	}
	say("node %s: 2 simulated H200s in %s, a pod on each of their %d MIG devices (kubelet stand-in serves PodResources)", node, before, len(pods))

	agentLog := filepath.Join(work, "agent.log")
	logf, err := os.Create(agentLog)
	if err != nil {
		return err
	}
	defer logf.Close()
	a := exec.Command(bin, "run", "--node-name", node, "--kubeconfig", kubeconfig, "--namespace", agentNS,
		"--nvml", sim, "--sim-state", simState, "-f", cfgFile, "--state-dir", filepath.Join(work, "state"),
		"--metrics-address", "", "--reboot-method", "none", "--resource-wait-timeout", "0",
		"--pod-resources-socket", kubelet.Socket())
	a.Stdout, a.Stderr = logf, logf
	if err := a.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	var agentErr error
	go func() { agentErr = a.Wait(); close(done) }()
	stopAgent := func() error {
		_ = a.Process.Signal(syscall.SIGTERM)
		<-done
		return agentErr
	}
	defer stopAgent()
	withLog := func(err error) error {
		tail, _ := exec.Command("tail", "-n", "20", agentLog).Output()
		return fmt.Errorf("%w\nagent log (last lines):\n%s", err, tail)
	}
	nw, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		return err
	}
	defer nw.Stop()
	w := &watcher{node: nw.ResultChan(), agentDone: done}
	if _, err := w.until(ctx, before); err != nil {
		return withLog(err)
	}
	say("mig-agent run: %s holds %s (already applied: no GPU touched)", node, before)

	// The dry run says what the change takes away; the table shows it.
	raw, err := agentCmd("plan", "-f", cfgFile, "-c", after, "-o", "json")
	if err != nil {
		return err
	}
	if err := explain(raw, pods); err != nil {
		return err
	}
	pw, err := c.CoreV1().Pods(podNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	defer pw.Stop()
	say("labelling %s=%s (GPU 1 changes, GPU 0 does not)", record.LabelConfig, after)
	w.pods, w.table, w.t0 = pw.ResultChan(), newTable(os.Stdout, pods), time.Now()
	if err := setLabel(ctx, c, after); err != nil {
		return err
	}
	rec, err := w.until(ctx, after)
	if err != nil {
		return withLog(err)
	}
	w.table.final()
	if err := check(pods, rec); err != nil {
		return withLog(err)
	}
	say("%d of %d pods evicted (%s), the other %d never stopped", len(rec.EvictedPods), len(pods),
		strings.Join(rec.EvictedPods, ", "), len(pods)-len(rec.EvictedPods))
	say("audit record (%s, geometry left out):", record.AnnotationLastChange)
	rec.Geometry = nil
	if err := printFields(rec); err != nil {
		return err
	}
	if err := stopAgent(); err != nil {
		return fmt.Errorf("agent exit (SIGTERM): %w", err)
	}
	say("done in %.1fs; stopping the API server (it takes up to 15 s to let go)", time.Since(t0).Seconds())
	return nil
}

// printFields prints v's JSON one field a line, values compact.
func printFields(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return err
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return err
		}
		fmt.Printf("    %-19s %s\n", key.(string)+":", val)
	}
	return nil
}

func setLabel(ctx context.Context, c kubernetes.Interface, config string) error {
	patch := fmt.Sprintf(`{"apiVersion":"v1","kind":"Node","metadata":{"name":%q,"labels":{%q:%q}}}`, node, record.LabelConfig, config)
	force := true
	_, err := c.CoreV1().Nodes().Patch(ctx, node, types.ApplyPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "platform-team", Force: &force})
	return err
}

type instance struct {
	gpu, start    int
	profile, uuid string
}

// readGeometry lists the MIG devices the simulated GPUs hold (mig-agent
// profiles -o json).
func readGeometry(agentCmd func(...string) ([]byte, error)) ([]instance, error) {
	raw, err := agentCmd("profiles", "-o", "json")
	if err != nil {
		return nil, err
	}
	var prof struct {
		GPUs []struct {
			Index     int `json:"index"`
			Instances []struct {
				Profile string `json:"profile"`
				Start   int    `json:"start"`
				UUID    string `json:"uuid"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(raw, &prof); err != nil {
		return nil, fmt.Errorf("mig-agent profiles -o json: %w", err)
	}
	var out []instance
	for _, g := range prof.GPUs {
		for _, in := range g.Instances {
			out = append(out, instance{gpu: g.Index, start: in.Start, profile: in.Profile, uuid: in.UUID})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("the simulated GPUs hold no MIG device")
	}
	return out, nil
}

// placement is a GPU instance's profile and start slice.
type placement struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
}

// explain fills each pod's verdict from the dry run (mig-agent plan -o
// json): a pod is evicted when the GPU instance holding its MIG device is
// destroyed, and stays when its GPU is untouched or its instance is kept.
func explain(planJSON []byte, pods []*pod) error {
	var plan struct {
		GPUs []struct {
			Index   int         `json:"index"`
			Action  string      `json:"action"`
			Destroy []placement `json:"destroy"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(planJSON, &plan); err != nil {
		return fmt.Errorf("mig-agent plan -o json: %w", err)
	}
	for _, p := range pods {
		for _, g := range plan.GPUs {
			if g.Index != p.gpu {
				continue
			}
			switch {
			case g.Action != "change":
				p.why = fmt.Sprintf("GPU %d is untouched", g.Index)
			case slices.Contains(g.Destroy, placement{p.profile, p.start}):
				p.evict, p.why = true, fmt.Sprintf("GPU %d changes and destroys its %s", g.Index, p.device)
			default:
				p.why = fmt.Sprintf("GPU %d changes but keeps its %s", g.Index, p.device)
			}
		}
	}
	return nil
}

// check holds the outcome against the dry run: exactly the pods on
// destroyed instances were evicted (record and API server agree), the rest
// still run, and the record carries no error.
func check(pods []*pod, rec record.ChangeRecord) error {
	var want []string
	for _, p := range pods {
		if p.evict {
			want = append(want, podNS+"/"+p.name)
			if p.now != "gone" {
				return fmt.Errorf("pod %s should be evicted, is %s", p.name, p.now)
			}
		} else if p.now != "Running" {
			return fmt.Errorf("pod %s should still run, is %s", p.name, p.now)
		}
	}
	got := slices.Clone(rec.EvictedPods)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("the record says %v evicted, the dry run %v", got, want)
	}
	if rec.Reason != "" || rec.AffectedBy != "pod-resources" {
		return fmt.Errorf("the record reports an error: reason %q, affectedBy %q", rec.Reason, rec.AffectedBy)
	}
	return nil
}

// watcher follows the Node (and, once table is set, the pods) until a
// change's record is final.
type watcher struct {
	node      <-chan watch.Event
	pods      <-chan watch.Event // nil: not followed
	agentDone <-chan struct{}
	table     *table // nil: nothing shown
	t0        time.Time
	state     string // the state label last seen
}

// until waits until the Node's record for config is final and the state
// label agrees.
func (w *watcher) until(ctx context.Context, config string) (record.ChangeRecord, error) {
	timeout := time.After(60 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return record.ChangeRecord{}, ctx.Err()
		case <-w.agentDone:
			return record.ChangeRecord{}, errors.New("mig-agent exited")
		case <-timeout:
			return record.ChangeRecord{}, fmt.Errorf("no final record for %s within 60s", config)
		case ev := <-w.pods:
			p, ok := ev.Object.(*corev1.Pod)
			switch {
			case !ok:
			case ev.Type == watch.Deleted:
				w.table.set(time.Since(w.t0), p.Name, "gone")
			case p.DeletionTimestamp != nil:
				w.table.set(time.Since(w.t0), p.Name, "Terminating")
			}
		case ev, ok := <-w.node:
			if !ok {
				return record.ChangeRecord{}, errors.New("node watch closed")
			}
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			state := n.Labels[record.LabelState]
			if state != w.state && w.table != nil {
				w.table.event(time.Since(w.t0), "node", record.LabelState+"="+state)
			}
			w.state = state
			var rec record.ChangeRecord
			_ = json.Unmarshal([]byte(n.Annotations[record.AnnotationLastChange]), &rec)
			if rec.Config == config && (rec.Result == record.StateSuccess || rec.Result == record.StateFailed) && state == rec.Result {
				if rec.Result == record.StateFailed {
					return rec, fmt.Errorf("the change to %s failed: %s", config, rec.Reason)
				}
				return rec, nil
			}
		}
	}
}

// table is the live table of pods. On a terminal it is redrawn in place
// under a status line; otherwise each change is printed as a line and the
// table once at the end.
type table struct {
	out    *os.File
	pods   []*pod
	tty    bool
	drawn  int // lines drawn last time (terminal)
	status string
}

func newTable(out *os.File, pods []*pod) *table {
	st, err := out.Stat()
	t := &table{out: out, pods: pods, tty: err == nil && st.Mode()&os.ModeCharDevice != 0, status: "+0.0s"}
	if t.tty {
		t.draw()
	}
	return t
}

func (t *table) set(at time.Duration, name, now string) {
	for _, p := range t.pods {
		if p.name == name && p.now != now {
			p.now = now
			t.event(at, "pod "+podNS+"/"+name, now)
		}
	}
}

func (t *table) event(at time.Duration, what, now string) {
	line := fmt.Sprintf("+%5.2fs  %s %s", at.Seconds(), what, now)
	if !t.tty {
		fmt.Fprintln(t.out, "    "+line)
		return
	}
	t.status = line
	t.draw()
}

func (t *table) final() {
	if !t.tty {
		t.draw()
	}
}

func (t *table) draw() {
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "    POD\tGPU\tMIG DEVICE\tPLAN\tNOW\tWHY")
	for _, p := range t.pods {
		plan := "stays"
		if p.evict {
			plan = "evicted"
		}
		fmt.Fprintf(w, "    %s\t%d\t%s\t%s\t%-11s\t%s\n", p.name, p.gpu, p.device, plan, p.now, p.why)
	}
	_ = w.Flush()
	if t.tty {
		if t.drawn > 0 {
			fmt.Fprintf(t.out, "\x1b[%dA\x1b[J", t.drawn)
		}
		fmt.Fprintf(&b, "    %s\n", t.status)
		t.drawn = bytes.Count(b.Bytes(), []byte("\n"))
	}
	_, _ = t.out.Write(b.Bytes())
}
