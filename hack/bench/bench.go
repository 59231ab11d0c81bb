package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/benchfile"
)

// apiServer is the kube-apiserver + etcd the script started.
type apiServer struct {
	script, dir, kubeconfig string
	client                  kubernetes.Interface
}

func startAPIServer(ctx context.Context, script string) (*apiServer, error) {
	cmd := exec.CommandContext(ctx, "bash", script, "start", "--owner-pid", strconv.Itoa(os.Getpid()))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver with %s: %w", script, err)
	}
	a := &apiServer{script: script, kubeconfig: strings.TrimSpace(string(out))}
	a.dir = filepath.Dir(a.kubeconfig)
	cfg, err := clientcmd.BuildConfigFromFlags("", a.kubeconfig)
	if err != nil {
		a.stop()
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	cfg.UserAgent = "mig-agent-bench"
	if a.client, err = kubernetes.NewForConfig(cfg); err != nil {
		a.stop()
		return nil, err
	}
	return a, nil
}

func (a *apiServer) stop() {
	cmd := exec.Command("bash", a.script, "stop", a.dir)
	cmd.Stderr = os.Stderr
	_ = cmd.Run()
}

var requestLine = regexp.MustCompile(`^apiserver_request_total\{(.*)\} (\S+)$`)
var labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)

// requestCounts reads apiserver_request_total from the server's /metrics
// (admin token), keyed "VERB resource[/subresource]".
func (a *apiServer) requestCounts(ctx context.Context) (map[string]float64, error) {
	raw, err := a.client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := requestLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		l := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[1], -1) {
			l[p[1]] = p[2]
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += v
	}
	return out, sc.Err()
}

// proc is one mig-agent process.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func startProc(bin string, args ...string) (*proc, error) {
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// rss reads the process's resident set (VmRSS) and its anonymous and
// file-backed parts (RssAnon, RssFile), in MiB.
func (p *proc) rss() (total, anon, file float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, 0, err
	}
	found := 0
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, perr := strconv.ParseFloat(f[1], 64)
		if perr != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			total, found = kb/1024, found+1
		case "RssAnon:":
			anon = kb / 1024
		case "RssFile:":
			file = kb / 1024
		}
	}
	if found == 0 {
		return 0, 0, 0, errors.New("no VmRSS in /proc/PID/status")
	}
	return total, anon, file, nil
}

// bench holds what the measurements share.
type bench struct {
	api      *apiServer
	agentBin string
	work     string
	cfgFile  string
	n        int
}

const benchNamespace = "mig-agent"

// startAgent runs `mig-agent run` for node with the production defaults
// but for the simulated GPUs, no reboots and the kubelet socket given.
func (b *bench) startAgent(ctx context.Context, node, simState, socket string, extra ...string) (*proc, error) {
	args := []string{"run", "--node-name", node, "--kubeconfig", b.api.kubeconfig, "--namespace", benchNamespace,
		"--nvml", "sim:h200x8", "--sim-state", simState, "--state-dir", filepath.Join(b.work, node+"-state"),
		"--metrics-address", "", "--reboot-method", "none", "--pod-resources-socket", socket, "-f", b.cfgFile}
	p, err := startProc(b.agentBin, append(args, extra...)...)
	if err != nil {
		return nil, err
	}
	// Started once the node watch is up: its start Event.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := b.api.client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", node).String()})
		if err == nil {
			for _, e := range evs.Items {
				if e.Reason == "MigAgentStarted" {
					return p, nil
				}
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("mig-agent exited:\n%s", p.output())
		case <-time.After(20 * time.Millisecond):
		}
	}
	p.stop()
	return nil, fmt.Errorf("mig-agent did not start within 30s:\n%s", p.output())
}

func (b *bench) createNode(ctx context.Context, name string, labels map[string]string) error {
	_, err := b.api.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	return err
}

func (b *bench) setLabel(ctx context.Context, node, config string) error {
	patch, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": node, "labels": map[string]any{record.LabelConfig: config}}})
	_, err := b.api.client.CoreV1().Nodes().Patch(ctx, node, types.ApplyPatchType, patch,
		metav1.PatchOptions{FieldManager: "bench", Force: ptr.To(true)})
	return err
}

// waitSuccess polls until node reports success on config.
func (b *bench) waitSuccess(ctx context.Context, node, config string, timeout time.Duration) (record.ChangeRecord, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		n, err := b.api.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil && n.Labels[record.LabelState] == record.StateSuccess {
			var rec record.ChangeRecord
			if json.Unmarshal([]byte(n.Annotations[record.AnnotationLastChange]), &rec) == nil && rec.Config == config && rec.Result == record.StateSuccess {
				return rec, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return record.ChangeRecord{}, fmt.Errorf("node %s: no success on %s within %s", node, config, timeout)
}

// latency times n label changes (all-disabled ↔ all-balanced, no pods),
// pause apart, from the label patch to the pending and success states, seen
// through a watch.
// It returns the agent, left running for the idle measurement.
func (b *bench) latency(ctx context.Context, n int, pause time.Duration, r *results) (*proc, error) {
	c := b.api.client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	const node = "bench-latency"
	if err := b.createNode(ctx, node, nil); err != nil {
		return nil, err
	}
	k, err := startKubelet(c, node)
	if err != nil {
		return nil, err
	}
	// Debug lines in JSON: the checklist's "step done" lines time each step.
	p, err := b.startAgent(ctx, node, filepath.Join(b.work, "latency-sim.json"), k.socket, "--log-level", "debug", "--log-format", "json")
	if err != nil {
		k.stop()
		return nil, err
	}
	type seen struct {
		at     time.Time
		state  string
		config string
		result string
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := c.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
	if err != nil {
		p.stop()
		return nil, err
	}
	defer w.Stop()
	events := make(chan seen, 1024)
	go func() {
		for ev := range w.ResultChan() {
			nd, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			var rec record.ChangeRecord
			_ = json.Unmarshal([]byte(nd.Annotations[record.AnnotationLastChange]), &rec)
			events <- seen{time.Now(), nd.Labels[record.LabelState], rec.Config, rec.Result}
		}
		close(events)
	}()
	steps := &stepTimes{ms: map[string][]float64{}}
	r.LoadAvgBefore = benchfile.LoadAvg()
	for i := range n {
		target := "all-balanced"
		if i%2 == 1 {
			target = "all-disabled"
		}
		if i > 0 {
			time.Sleep(pause)
		}
		start := time.Now()
		logFrom := len(p.output())
		if err := b.setLabel(ctx, node, target); err != nil {
			p.stop()
			return nil, err
		}
		r.LabelPatchMs = append(r.LabelPatchMs, ms(time.Since(start)))
		var pending time.Time
		timeout := time.After(60 * time.Second)
	wait:
		for {
			select {
			case s, ok := <-events:
				if !ok {
					p.stop()
					return nil, errors.New("node watch closed")
				}
				if s.state == record.StatePending && pending.IsZero() {
					pending = s.at
				}
				if !pending.IsZero() && s.state == record.StateSuccess && s.config == target && s.result == record.StateSuccess {
					r.LabelToPendingMs = append(r.LabelToPendingMs, ms(pending.Sub(start)))
					r.LabelToSuccessMs = append(r.LabelToSuccessMs, ms(s.at.Sub(start)))
					// The finish step's line follows the success it records.
					for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && !strings.Contains(p.output()[logFrom:], `"step":"finish"`); {
						time.Sleep(5 * time.Millisecond)
					}
					steps.add(start, p.output()[logFrom:])
					break wait
				}
			case <-timeout:
				p.stop()
				return nil, fmt.Errorf("change %d to %s: no pending then success within 60s:\n%s", i+1, target, p.output())
			}
		}
	}
	r.LoadAvgAfter = benchfile.LoadAvg()
	r.LabelToPendingMsMedian, r.LabelToSuccessMsMedian = median(r.LabelToPendingMs), median(r.LabelToSuccessMs)
	r.LabelToPendingSpread, r.LabelToSuccessSpread = spreadOf(r.LabelToPendingMs), spreadOf(r.LabelToSuccessMs)
	r.Steps = steps.medians()
	if nd, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
		r.NodeAnnotationBytes, r.NodeRecordBytes = kube.AnnotationBytes(nd), kube.Footprint(nd)
	}
	if cm, err := c.CoreV1().ConfigMaps(benchNamespace).Get(ctx, record.HistoryConfigMapName(node), metav1.GetOptions{}); err == nil {
		r.HistoryConfigMapBytes = len(cm.Data[record.HistoryConfigMapKey])
	}
	return p, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// stepLabelToChecklist names the time from the label patch to the start of
// the checklist's first step: the watch event and the pass's decision.
const stepLabelToChecklist = "label → checklist"

// stepTime is one step's median over the timed changes.
type stepTime struct {
	Step     string  `json:"step"`
	MsMedian float64 `json:"msMedian"`
}

// stepTimes gathers the agent's "step done" debug lines of each change.
type stepTimes struct {
	order []string
	ms    map[string][]float64
}

// add reads the JSON log lines one change wrote (log, from its label
// patch at start on).
func (st *stepTimes) add(start time.Time, log string) {
	first := true
	for _, l := range strings.Split(log, "\n") {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
			Step string    `json:"step"`
			Ms   float64   `json:"ms"`
		}
		if json.Unmarshal([]byte(l), &line) != nil || line.Msg != "step done" {
			continue
		}
		if first {
			began := line.Time.Add(-time.Duration(line.Ms * float64(time.Millisecond)))
			st.put(stepLabelToChecklist, ms(began.Sub(start)))
			first = false
		}
		st.put(line.Step, line.Ms)
	}
}

func (st *stepTimes) put(step string, v float64) {
	if _, ok := st.ms[step]; !ok {
		st.order = append(st.order, step)
	}
	st.ms[step] = append(st.ms[step], v)
}

func (st *stepTimes) medians() []stepTime {
	out := make([]stepTime, 0, len(st.order))
	for _, step := range st.order {
		out = append(out, stepTime{Step: step, MsMedian: median(st.ms[step])})
	}
	return out
}

type profilesJSON struct {
	GPUs []struct {
		UUID      string `json:"uuid"`
		Instances []struct {
			Profile string `json:"profile"`
			Start   int    `json:"start"`
			UUID    string `json:"uuid"`
		} `json:"instances"`
	} `json:"gpus"`
}

// evictions changes GPU 0 of an H200x8 node whose GPUs each run two pods
// (on the MIG devices at placements 0 and 1, which the change destroys on
// GPU 0) and counts the pods evicted. withPodResources false points the
// agent at no kubelet socket, so it falls back to every GPU pod of the node:
// a whole-node drain, which is what NVIDIA's MIG manager does.
func (b *bench) evictions(ctx context.Context, withPodResources bool) (evicted, onChanged, onNode int, err error) {
	c := b.api.client
	b.n++
	node := fmt.Sprintf("bench-evict-%d", b.n)
	ns := node
	simState := filepath.Join(b.work, node+"-sim.json")
	if out, err := exec.CommandContext(ctx, b.agentBin, "apply", "-c", "all-1g.18gb", "--nvml", "sim:h200x8", "--sim-state", simState).CombinedOutput(); err != nil {
		return 0, 0, 0, fmt.Errorf("preparing the GPUs: %w: %s", err, out)
	}
	raw, err := exec.CommandContext(ctx, b.agentBin, "profiles", "-o", "json", "--nvml", "sim:h200x8", "--sim-state", simState).Output()
	if err != nil {
		return 0, 0, 0, err
	}
	var prof profilesJSON
	if err := json.Unmarshal(raw, &prof); err != nil {
		return 0, 0, 0, err
	}
	if err := b.createNode(ctx, node, map[string]string{record.LabelConfig: "all-1g.18gb"}); err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) }()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return 0, 0, 0, err
	}
	defer func() {
		_ = c.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	}()
	k, err := startKubelet(c, node)
	if err != nil {
		return 0, 0, 0, err
	}
	defer k.stop()
	for g, gpu := range prof.GPUs {
		for _, in := range gpu.Instances {
			if in.Start > 1 {
				continue
			}
			if err := k.runPod(ctx, ns, fmt.Sprintf("gpu%d-pod%d", g, in.Start), "nvidia.com/mig-"+in.Profile, in.UUID); err != nil {
				return 0, 0, 0, err
			}
			onNode++
			if g == 0 {
				onChanged++
			}
		}
	}
	socket := k.socket
	if !withPodResources {
		socket = filepath.Join(b.work, "no-kubelet.sock")
	}
	p, err := b.startAgent(ctx, node, simState, socket)
	if err != nil {
		return 0, 0, 0, err
	}
	defer p.stop()
	if _, err := b.waitSuccess(ctx, node, "all-1g.18gb", 30*time.Second); err != nil {
		return 0, 0, 0, err
	}
	if err := b.setLabel(ctx, node, "one-gpu"); err != nil {
		return 0, 0, 0, err
	}
	rec, err := b.waitSuccess(ctx, node, "one-gpu", 2*time.Minute)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%w:\n%s", err, p.output())
	}
	if got := len(k.evicted()); got != len(rec.EvictedPods) {
		return 0, 0, 0, fmt.Errorf("the kubelet finished %d pods, the record says %d evicted", got, len(rec.EvictedPods))
	}
	return len(rec.EvictedPods), onChanged, onNode, nil
}

// idle counts the API requests of the agent left from the latency runs over
// a window, from the server's apiserver_request_total, which has no label
// for the client: it counts the requests on the resources the agent uses
// (nodes, pods and their evictions, events, configmaps, resourceslices;
// Leases only with --max-concurrent, which the bench does not set) except
// watches (the agent's one node watch is held open, and re-opened now and
// then). The rest is the server's own traffic (its identity Leases, the
// service IP repair loop, OpenAPI) and is reported apart. It reads the
// agent's RSS at the end.
func (b *bench) idle(ctx context.Context, p *proc, window time.Duration, r *results) error {
	before, err := b.api.requestCounts(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	select {
	case <-time.After(window):
	case <-p.done:
		return errors.New("the agent exited during the idle window")
	}
	after, err := b.api.requestCounts(ctx)
	if err != nil {
		return err
	}
	took := time.Since(start)
	r.IdleRequests, r.IdleExcluded = map[string]int{}, map[string]int{}
	total := 0
	for k, v := range after {
		d := int(v - before[k])
		if d <= 0 {
			continue
		}
		verb, res, _ := strings.Cut(k, " ")
		res, _, _ = strings.Cut(res, "/")
		switch {
		case verb == "WATCH" || verb == "WATCHLIST":
			r.IdleExcluded[k] = d
		case !slices.Contains([]string{"nodes", "pods", "events", "configmaps", "resourceslices"}, res):
			r.IdleExcluded[k] = d
		default:
			r.IdleRequests[k] = d
			total += d
		}
	}
	r.IdleWindowSeconds = took.Seconds()
	r.IdleAPIRequestsPerMin = float64(total) / took.Minutes()
	r.RSSMiB, r.RSSAnonMiB, r.RSSFileMiB, err = p.rss()
	return err
}
