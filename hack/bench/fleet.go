package main

// The fleet bench (`make fleet-bench`): K simulated nodes on one real API
// server, each a real `mig-agent run` process on sim:h200x8 with its own
// state, a pool-wide label change applied to all K at once, for each
// --max-concurrent N. See docs/fleet.md ("Sizing a rollout").

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/migagent/mig-agent/hack/bench/turns"
	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/record"
	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

// slotChange is a slot Lease's holder from at ("": released).
type slotChange struct {
	at     time.Time
	holder string
}

// slotTimeline is every slot's holders as the bench's watch saw them.
type slotTimeline struct {
	mu      sync.Mutex
	changes map[string][]slotChange
	// joins: per node, the first slot queue the watch saw it in, and when.
	joins map[string]slotJoin
	// tickets: per node, its place in line (lease.AnnotationTicket, the
	// SEQ of its queue entries) as the watch saw it.
	tickets map[string]int64
	// maxQueue: the longest queue seen on a slot (entries, served or not).
	maxQueue int
}

// slotJoin: a node seen in a slot's queue.
type slotJoin struct {
	slot string
	at   time.Time
}

func (t *slotTimeline) note(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	h := ""
	if l.Spec.HolderIdentity != nil {
		h = *l.Spec.HolderIdentity
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tickets == nil {
		t.tickets = map[string]int64{}
	}
	if tk, err := strconv.ParseInt(l.Annotations[lease.AnnotationTicket], 10, 64); err == nil && h != "" {
		t.tickets[h] = tk
	}
	qn := 0
	for k, v := range l.Annotations {
		if !strings.HasPrefix(k, lease.QueueKeyPrefix) {
			continue
		}
		qn++
		if seq, node, ok := strings.Cut(v, " "); ok {
			if tk, err := strconv.ParseInt(seq, 10, 64); err == nil {
				t.tickets[node] = tk
			}
			if _, seen := t.joins[node]; !seen {
				if t.joins == nil {
					t.joins = map[string]slotJoin{}
				}
				t.joins[node] = slotJoin{slot: l.Name, at: now}
			}
		}
	}
	t.maxQueue = max(t.maxQueue, qn)
	cs := t.changes[l.Name]
	if n := len(cs); n > 0 && cs[n-1].holder == h {
		return
	}
	t.changes[l.Name] = append(cs, slotChange{at: now, holder: h})
}

// ticket is node's place in line as the watch saw it (0: unknown), a
// time in Unix milliseconds.
func (t *slotTimeline) ticket(node string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tickets[node]
}

// longestQueue is the most queue entries seen on a slot at once.
func (t *slotTimeline) longestQueue() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxQueue
}

// servedAhead is, of the nodes the watch saw join a queue, the most that
// took that slot after the node joined and before the node took a slot
// (its own or another) though their changes began later (their tickets;
// one without a ticket counts), and the number of nodes seen queued. Over
// every slot, the same count over n is rounds: the most rounds a node
// waited past its turn once in line (what the queue decides, without the
// time before a node first asked), and how many waited more than two.
func (t *slotTimeline) servedAhead(n int) (most, queued int, rounds float64, overTwo int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for node, j := range t.joins {
		took := time.Time{}
		for _, cs := range t.changes {
			for _, c := range cs {
				if c.holder == node && c.at.After(j.at) && (took.IsZero() || c.at.Before(took)) {
					took = c.at
				}
			}
		}
		if took.IsZero() {
			continue // not seen taking a slot after its join
		}
		later := func(c slotChange) bool {
			tk, known := t.tickets[c.holder]
			return c.holder != "" && c.holder != node && c.at.After(j.at) && c.at.Before(took) && (!known || tk > t.tickets[node])
		}
		here, anywhere := 0, map[string]bool{}
		for slot, cs := range t.changes {
			for _, c := range cs {
				if later(c) {
					anywhere[c.holder] = true
					if slot == j.slot {
						here++
					}
				}
			}
		}
		late := float64(len(anywhere)) / float64(max(n, 1))
		if late > 2 {
			overTwo++
		}
		most, queued, rounds = max(most, here), queued+1, max(rounds, late)
	}
	return most, queued, rounds, overTwo
}

// asked pairs each node of recs (recNodes) that the watch saw a ticket of
// with its record: its turn by ticket and when it took a slot, and the
// milliseconds from its startedAt to its ticket. odd counts the tickets
// outside [startedAt, disruptedAt] (by the millisecond): a ticket is when
// the node first saw the slots, after its change began, before it took one.
func (t *slotTimeline) asked(recs []record.ChangeRecord, recNodes []string) (w []turns.Waited, lagMs []float64, odd int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, rec := range recs {
		tk, ok := t.tickets[recNodes[i]]
		if !ok || rec.DisruptedAt == nil {
			continue
		}
		if tk < rec.StartedAt.UnixMilli() || tk > rec.DisruptedAt.UnixMilli() {
			odd++
			continue
		}
		w = append(w, turns.Waited{Turn: time.UnixMilli(tk), Took: *rec.DisruptedAt, Node: recNodes[i]})
		lagMs = append(lagMs, float64(tk-rec.StartedAt.UnixMilli()))
	}
	return w, lagMs, odd
}

// since is each slot's changes from from on (slots without any left out).
func (t *slotTimeline) since(from time.Time) map[string][]slotChange {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string][]slotChange{}
	for name, cs := range t.changes {
		var keep []slotChange
		for _, c := range cs {
			if !c.at.Before(from) {
				keep = append(keep, c)
			}
		}
		if len(keep) > 0 {
			out[name] = keep
		}
	}
	return out
}

// countHandOffs counts, in changes, the holder changes from one node
// straight to another (a hand-off in one write) and through a release.
func countHandOffs(changes map[string][]slotChange) handOffCount {
	var n handOffCount
	for _, cs := range changes {
		for i := 1; i < len(cs); i++ {
			switch {
			case cs[i].holder == "":
			case cs[i-1].holder != "":
				n.Direct++
			default:
				n.Released++
			}
		}
	}
	return n
}

// handOffCount: the takes of a slot after its first, by how they came.
type handOffCount struct {
	Direct   int `json:"direct"`   // handed by the last holder to the next, one write
	Released int `json:"released"` // released, then taken
}

// fleetResults is the "fleet" section of bench-results.json.
type fleetResults struct {
	Date    string     `json:"date"`
	Commit  string     `json:"commit"`
	Machine string     `json:"machine"`
	Config  string     `json:"config"` // the pool-wide change: all-disabled → this
	Runs    []fleetRun `json:"runs"`
	// ServerBaselinePerSec is the API server's request rate with no agent
	// at all (its own lease renewals and the like), included in every rate.
	ServerBaselinePerSec float64  `json:"serverBaselinePerSec"`
	Failures             []string `json:"failures,omitempty"`
}

// fleetRun is one (K, N) rollout.
type fleetRun struct {
	Nodes         int `json:"nodes"`
	MaxConcurrent int `json:"maxConcurrent"`
	// RolloutSeconds: from the label patches to the last node's success.
	RolloutSeconds float64 `json:"rolloutSeconds"`
	Converged      int     `json:"converged"`
	// MaxDisrupted: the most records ever overlapping between disruptedAt
	// and finishedAt (<= MaxConcurrent, or the run fails).
	MaxDisrupted int `json:"maxDisrupted"`
	// DisruptionMsMedian: per node, disruptedAt → finishedAt (the time a
	// node holds its slot: the per-node apply time on the simulator).
	DisruptionMsMedian float64 `json:"disruptionMsMedian"`
	// Requests at the API server (apiserver_request_total, the bench's own
	// requests subtracted; the server's own included, see ServerBaselinePerSec).
	RolloutRequests       float64 `json:"rolloutRequests"`
	RolloutRequestsPerSec float64 `json:"rolloutRequestsPerSec"`
	LeaseConflicts        float64 `json:"leaseConflicts"`
	// From the API server's audit log (KUBE_TEST_AUDIT=all), the agents'
	// own requests in the rollout (user agent mig-agent/…), by name: the
	// rollout slots' Lease requests per node (the hand-off's cost: ≤ 3 is
	// the target), the node Leases', their 409s, and every request by
	// "verb resource[/subresource]".
	SlotLeaseRequestsPerNode float64        `json:"slotLeaseRequestsPerNode"`
	NodeLeaseRequestsPerNode float64        `json:"nodeLeaseRequestsPerNode"`
	AgentRequestsPerNode     float64        `json:"agentRequestsPerNode"`
	AgentLeaseConflicts      int            `json:"agentLeaseConflicts"`
	ConflictShare            float64        `json:"conflictShare"` // agentLeaseConflicts / agent requests in the rollout
	AgentRequests            map[string]int `json:"agentRequests,omitempty"`
	// From the bench's own watch of the slot Leases, each slot's holders
	// in time order. SlotHoldMsMedian: from a holder's take (or the
	// hand-off to it) to the next change, the time a slot is busy a node;
	// HandOffMsMedian: from a release to the next take (a slot handed on
	// in one write has none); RolloutOverHolds: the rollout time over
	// ⌈K/N⌉ × SlotHoldMsMedian; RolloutOverNodeTime: over ⌈K/N⌉ ×
	// DisruptionMsMedian (the node's own time, from when it saw the slot
	// its own: the hand-off's latency counts against it).
	SlotHoldMsMedian float64 `json:"slotHoldMsMedian"`
	HandOffMsMedian  float64 `json:"handOffMsMedian"`
	// SlotTime splits a slot's share of the rollout (from the same watch).
	SlotTime *slotTime `json:"slotTime,omitempty"`
	// HandOffs: how the slots passed from node to node (the bench's watch).
	HandOffs         handOffCount `json:"handOffs"`
	RolloutOverHolds float64      `json:"rolloutOverHolds"`
	// RolloutOverMakespan: the rollout time over what a perfect semaphore
	// of N slots would take with these nodes: the lead-in (a slot's first
	// take, median over the slots: no node can take a slot before its
	// label reached it and its checks passed) plus ⌈K/N⌉ × the mean hold
	// (each slot serving its share back to back, no time between holds,
	// the work shared evenly). What exceeds 1 is lost between holds or to
	// slots that served more than their share.
	RolloutOverMakespan float64 `json:"rolloutOverMakespan"`
	// RolloutOverListSchedule: the rollout time over a perfect first
	// come, first served semaphore of N slots with this run's very nodes:
	// each node, in ticket order, on the slot free first, from when it
	// asked (its ticket) or that slot's last hold ended, whichever is
	// later, for as long as it held its slot here (turns.ListSchedule). Above 1
	// is what the slots lost (time between holds, a slot idle while a
	// node waited); the rest of RolloutOverMakespan is the lead-in and
	// the holds' spread (a few long holds, on 2 shared cores, end the
	// rollout late whatever the hand-off).
	RolloutOverListSchedule float64 `json:"rolloutOverListSchedule"`
	// SlotLeaseRequests counts the slot Lease requests by verb and
	// response code ("update 409"): which requests a rollout's slots cost.
	SlotLeaseRequests   map[string]int `json:"slotLeaseRequests,omitempty"`
	RolloutOverNodeTime float64        `json:"rolloutOverNodeTime"`
	// MaxRoundsLate: fairness, from the change records. A node's turn is
	// its place by startedAt (when its change began: the label reached it
	// and its checks started); it is late by the nodes that began after
	// it but took a slot (disruptedAt) before it, over N: rounds of N
	// slots. NodesOverTwoRoundsLate counts the nodes more than two late.
	MaxRoundsLate          float64 `json:"maxRoundsLate"`
	NodesOverTwoRoundsLate int     `json:"nodesOverTwoRoundsLate"`
	// MaxRoundsLateByAsk: fairness by when a node asked for a slot, the
	// queues' own order. A node's turn is its place by its ticket (when
	// it first saw the slots, read from the bench's watch of them and
	// checked to lie between its startedAt and disruptedAt); late as in
	// MaxRoundsLate. AskLagMs*: from startedAt to the ticket (the node's
	// checks before it asks), median and most.
	MaxRoundsLateByAsk          float64 `json:"maxRoundsLateByAsk"`
	NodesOverTwoRoundsLateByAsk int     `json:"nodesOverTwoRoundsLateByAsk"`
	NodesTicketed               int     `json:"nodesTicketed"`
	AskLagMsMedian              float64 `json:"askLagMsMedian"`
	AskLagMsMax                 float64 `json:"askLagMsMax"`
	// MaxServedAheadInQueue: of the NodesQueued nodes the bench's watch
	// saw join a slot's queue, the most nodes whose changes began later
	// (by ticket) that took that slot after a node joined and before it
	// took a slot: its turn, once queued.
	MaxServedAheadInQueue int `json:"maxServedAheadInQueue"`
	NodesQueued           int `json:"nodesQueued"`
	// MaxRoundsLateInLine: of those nodes, the most rounds (nodes over N)
	// that began later and took any slot after the node joined a queue and
	// before it took one: fairness once in line, without the time between
	// a change's start and its first look at the slots.
	// NodesOverTwoRoundsLateInLine counts the nodes more than two late.
	MaxRoundsLateInLine          float64 `json:"maxRoundsLateInLine"`
	NodesOverTwoRoundsLateInLine int     `json:"nodesOverTwoRoundsLateInLine"`
	// LongestQueue: the most queue entries the bench's watch saw on a
	// slot at once (QueueLength, overrun by joins that came together).
	LongestQueue       int     `json:"longestQueue"`
	IdleRequestsPerSec float64 `json:"idleRequestsPerSec"`
	IdleWindowSeconds  float64 `json:"idleWindowSeconds"`
	// After an API server outage of OutageSeconds (run only where set):
	// requests in the first 10 s once /readyz said ok.
	OutageSeconds          float64  `json:"outageSeconds,omitempty"`
	RequestsFirst10sAfter  *float64 `json:"requestsFirst10sAfterOutage,omitempty"`
	AgentsReadyAfterOutage int      `json:"agentsReadyAfterOutage,omitempty"`
	// Agent memory: RssAnon of every agent, summed, after the rollout.
	AgentRSSAnonMiBSum  float64 `json:"agentRssAnonMiBSum"`
	AgentRSSAnonMiBMean float64 `json:"agentRssAnonMiBMean"`
	StartSeconds        float64 `json:"startSeconds"` // all K agents up
}

type fleetOptions struct {
	ks, ns      []int
	idle        time.Duration
	outage      time.Duration
	outageAll   bool // an outage after every run, not only the last N of each K
	config      string
	leaseDur    time.Duration
	startStride time.Duration
	logDir      string // each agent's log is written there after its run
	logLevel    string
	repeat      int // runs of each cell
}

// countingTransport counts the bench's own requests, so that they are
// taken out of the server's figures.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

type fleetBench struct {
	api      *apiServer
	client   kubernetes.Interface // counted
	own      atomic.Int64
	agentBin string
	work     string
	o        fleetOptions
}

// serverRequests is the server's request total since it started, every
// verb and resource, minus nothing.
func (f *fleetBench) serverRequests(ctx context.Context) (total, leaseConflicts float64, err error) {
	raw, err := f.client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		m := requestLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		total += v
		if strings.Contains(m[1], `resource="leases"`) && strings.Contains(m[1], `code="409"`) {
			leaseConflicts += v
		}
	}
	return total, leaseConflicts, nil
}

// window counts the server's requests over fn, the bench's own taken out.
func (f *fleetBench) window(ctx context.Context, fn func() error) (reqs, conflicts float64, took time.Duration, err error) {
	t0, c0, err := f.serverRequests(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	own0 := f.own.Load()
	start := time.Now()
	if err := fn(); err != nil {
		return 0, 0, 0, err
	}
	took = time.Since(start)
	own := f.own.Load() - own0 // the scrape that follows is counted by the server after it answers
	t1, c1, err := f.serverRequests(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	return t1 - t0 - float64(own), c1 - c0, took, nil
}

func runFleet(ctx context.Context, api *apiServer, agentBin, work string, o fleetOptions) (*fleetResults, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", api.kubeconfig)
	if err != nil {
		return nil, err
	}
	f := &fleetBench{api: api, agentBin: agentBin, work: work, o: o}
	cfg.QPS, cfg.Burst = 500, 1000
	cfg.UserAgent = "mig-agent-fleet-bench"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt: rt, n: &f.own} })
	if f.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	res := &fleetResults{Date: time.Now().UTC().Format(time.RFC3339), Commit: gitCommit(), Machine: machine(), Config: o.config}
	base, _, took, err := f.window(ctx, func() error { time.Sleep(10 * time.Second); return nil })
	if err != nil {
		return nil, err
	}
	res.ServerBaselinePerSec = base / took.Seconds()
	fmt.Fprintf(os.Stderr, "fleet-bench: server baseline %.2f requests/s\n", res.ServerBaselinePerSec)
	for _, k := range o.ks {
		for i, n := range o.ns {
			for rep := range max(o.repeat, 1) {
				// The outage follows the first run of a cell only.
				outage := rep == 0 && o.outage > 0 && (o.outageAll || i == len(o.ns)-1)
				run, err := f.run(ctx, k, n, rep, outage)
				if run != nil {
					res.Runs = append(res.Runs, *run)
				}
				if err != nil {
					res.Failures = append(res.Failures, fmt.Sprintf("K=%d N=%d run %d: %v", k, n, rep+1, err))
					fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d FAILED: %v\n", k, n, err)
				}
			}
		}
	}
	return res, nil
}

// run rolls all-disabled → o.config out over k fresh nodes with
// --max-concurrent n.
func (f *fleetBench) run(ctx context.Context, k, n, rep int, outage bool) (*fleetRun, error) {
	c := f.client
	ns := fmt.Sprintf("fleet-k%d-n%d", k, n)
	if rep > 0 {
		ns = fmt.Sprintf("fleet-k%d-n%d-r%d", k, n, rep+1)
	}
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: starting %d agents\n", k, n, k)
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	names := make([]string, k)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d", ns, i)
	}
	if err := parallel(16, names, func(node string) error {
		_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
			Labels: map[string]string{"bench.migagent.io/run": ns}}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, fmt.Errorf("creating nodes: %w", err)
	}
	dir := filepath.Join(f.work, ns)
	var procs []*proc
	defer func() {
		var wg sync.WaitGroup
		for _, p := range procs {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop() }()
		}
		wg.Wait()
		if f.o.logDir != "" {
			_ = os.MkdirAll(f.o.logDir, 0o755)
			for i, p := range procs {
				_ = os.WriteFile(filepath.Join(f.o.logDir, names[i]+".log"), []byte(p.output()), 0o644)
			}
		}
		_ = os.RemoveAll(dir)
	}()
	start := time.Now()
	for _, node := range names {
		args := []string{"run", "--node-name", node, "--kubeconfig", f.api.kubeconfig, "--namespace", ns,
			"--nvml", "sim:h200x8", "--sim-state", filepath.Join(dir, node, "sim.json"), "--state-dir", filepath.Join(dir, node, "state"),
			"--metrics-address", "", "--reboot-method", "none", "--pod-resources-socket", filepath.Join(dir, "no-kubelet.sock"),
			"--max-concurrent", strconv.Itoa(n), "--lease-duration", f.o.leaseDur.String(), "--log-level", f.o.logLevel}
		p, err := startProc(f.agentBin, args...)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		time.Sleep(f.o.startStride)
	}
	if err := f.waitStarted(ctx, names, procs, 60*time.Second+time.Duration(k)*300*time.Millisecond); err != nil {
		return nil, err
	}
	r := &fleetRun{Nodes: k, MaxConcurrent: n, StartSeconds: time.Since(start).Seconds()}
	time.Sleep(3 * time.Second) // the start's writes settle

	// The node watch of the bench: one list and one watch.
	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{"bench.migagent.io/run": ns}).String()
	}))
	inf := factory.Core().V1().Nodes().Informer()
	// The slot Leases' holders as they change (the bench's own watch): a
	// take, a release, or a hand-off from one node to the next (both at
	// once). Queue joins change no holder.
	slotFactory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns), informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.SelectorFromSet(labels.Set{lease.LabelRolloutSlot: "true"}).String()
	}))
	slots := &slotTimeline{changes: map[string][]slotChange{}}
	_, _ = slotFactory.Coordination().V1().Leases().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: slots.note, UpdateFunc: func(_, o any) { slots.note(o) }})
	done := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case done <- struct{}{}:
		default:
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }})
	stop := make(chan struct{})
	factory.Start(stop)
	slotFactory.Start(stop)
	defer func() { close(stop); factory.Shutdown(); slotFactory.Shutdown() }()
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	slotFactory.WaitForCacheSync(ctx.Done())
	var recNodes []string // the node of each of recs
	records := func() ([]record.ChangeRecord, int) {
		var recs []record.ChangeRecord
		recNodes = recNodes[:0]
		for _, obj := range inf.GetStore().List() {
			node := obj.(*corev1.Node)
			var rec record.ChangeRecord
			if node.Labels[record.LabelState] == record.StateSuccess &&
				json.Unmarshal([]byte(node.Annotations[record.AnnotationLastChange]), &rec) == nil &&
				rec.Config == f.o.config && rec.Result == record.StateSuccess {
				recs = append(recs, rec)
				recNodes = append(recNodes, node.Name)
			}
		}
		return recs, len(recs)
	}

	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: labelling every node %s\n", k, n, f.o.config)
	limit := 2*time.Minute + time.Duration(k/n+1)*10*time.Second
	var recs []record.ChangeRecord
	reqs, conflicts, took, err := f.window(ctx, func() error {
		if err := parallel(32, names, func(node string) error { return f.label(ctx, node) }); err != nil {
			return err
		}
		deadline := time.After(limit)
		for {
			if recs, r.Converged = records(); r.Converged == k {
				return nil
			}
			select {
			case <-done:
			case <-deadline:
				return fmt.Errorf("%d of %d nodes never reported success within %s", k-r.Converged, k, limit)
			}
		}
	})
	if err != nil {
		return r, err
	}
	r.RolloutSeconds, r.RolloutRequests, r.LeaseConflicts = took.Seconds(), reqs, conflicts
	if err := f.auditRollout(r, k, time.Now().Add(-took), slots); err != nil {
		return r, err
	}
	r.RolloutRequestsPerSec = reqs / took.Seconds()
	var spans []float64
	for _, rec := range recs {
		if rec.DisruptedAt == nil {
			return r, fmt.Errorf("a record without disruptedAt: %+v", rec)
		}
		spans = append(spans, float64(rec.FinishedAt.Sub(*rec.DisruptedAt).Microseconds())/1000)
	}
	r.MaxDisrupted, r.DisruptionMsMedian = record.MaxDisrupted(recs), median(spans)
	r.MaxRoundsLate, r.NodesOverTwoRoundsLate = roundsLate(recs, n)
	byAsk, lags, odd := slots.asked(recs, recNodes)
	if odd > 0 {
		return r, fmt.Errorf("%d nodes' tickets (when they first saw the slots) are not between their startedAt and disruptedAt", odd)
	}
	r.NodesTicketed = len(byAsk)
	r.MaxRoundsLateByAsk, r.NodesOverTwoRoundsLateByAsk = turns.RoundsPast(byAsk, n)
	if len(lags) > 0 {
		sort.Float64s(lags)
		r.AskLagMsMedian, r.AskLagMsMax = median(lags), lags[len(lags)-1]
	}
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: fairness by when a node asked (its ticket; %d nodes): at most %.2f rounds past its turn, %d nodes more than two; from startedAt to asking: median %.0f ms, at most %.0f ms\n",
		k, n, r.NodesTicketed, r.MaxRoundsLateByAsk, r.NodesOverTwoRoundsLateByAsk, r.AskLagMsMedian, r.AskLagMsMax)
	if i, passed := turns.MostPassed(byAsk); i >= 0 && passed > 0 {
		// Where to look in the agents' logs (-fleet-log-dir) for what
		// kept it.
		first := byAsk[0].Turn
		for _, x := range byAsk {
			if x.Turn.Before(first) {
				first = x.Turn
			}
		}
		fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: the node most past its turn by when it asked: %s, asked %d ms after the first node did, took a slot %d ms after it asked; %d nodes that asked later took one first\n",
			k, n, byAsk[i].Node, byAsk[i].Turn.Sub(first).Milliseconds(), byAsk[i].Took.Sub(byAsk[i].Turn).Milliseconds(), passed)
	}
	r.MaxServedAheadInQueue, r.NodesQueued, r.MaxRoundsLateInLine, r.NodesOverTwoRoundsLateInLine = slots.servedAhead(n)
	r.LongestQueue = slots.longestQueue()
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: fairness: by when changes began, at most %.2f rounds past its turn (nodes that began later but took a slot first, over N), %d nodes more than two rounds; once queued (%d nodes), at most %d that began later served ahead of a node on its slot, at most %.2f rounds past its turn on any slot (%d nodes more than two); the longest queue %d\n",
		k, n, r.MaxRoundsLate, r.NodesOverTwoRoundsLate, r.NodesQueued, r.MaxServedAheadInQueue, r.MaxRoundsLateInLine, r.NodesOverTwoRoundsLateInLine, r.LongestQueue)
	if r.DisruptionMsMedian > 0 {
		r.RolloutOverNodeTime = r.RolloutSeconds * 1000 / (float64((k+n-1)/n) * r.DisruptionMsMedian)
	}
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: a node's own time (disruptedAt → finishedAt) %.0f ms (median); rollout = %.2f × ⌈K/N⌉ × that; slots handed on in one write %d, released then taken %d\n",
		k, n, r.DisruptionMsMedian, r.RolloutOverNodeTime, r.HandOffs.Direct, r.HandOffs.Released)
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: all success in %.1fs, at most %d disrupted, %.0f requests (%.1f/s), %.0f lease conflicts\n",
		k, n, r.RolloutSeconds, r.MaxDisrupted, reqs, r.RolloutRequestsPerSec, conflicts)

	for _, p := range procs {
		_, anon, _, err := p.rss()
		if err != nil {
			return r, fmt.Errorf("agent memory: %w", err)
		}
		r.AgentRSSAnonMiBSum += anon
	}
	r.AgentRSSAnonMiBMean = r.AgentRSSAnonMiBSum / float64(k)

	idle, _, took, err := f.window(ctx, func() error { time.Sleep(f.o.idle); return nil })
	if err != nil {
		return r, err
	}
	r.IdleRequestsPerSec, r.IdleWindowSeconds = idle/took.Seconds(), took.Seconds()

	if outage {
		fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: API server down for %s\n", k, n, f.o.outage)
		if err := f.restartAPIServer(f.o.outage); err != nil {
			return r, err
		}
		after, _, _, err := f.window(ctx, func() error { time.Sleep(10 * time.Second); return nil })
		if err != nil {
			return r, err
		}
		r.OutageSeconds, r.RequestsFirst10sAfter = f.o.outage.Seconds(), &after
		fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: %.0f requests in the first 10 s after the outage\n", k, n, after)
	}
	if r.MaxDisrupted > n {
		return r, fmt.Errorf("%d nodes between disruption and success at once; --max-concurrent is %d", r.MaxDisrupted, n)
	}
	for _, p := range procs {
		select {
		case <-p.done:
			return r, fmt.Errorf("an agent exited:\n%s", p.output())
		default:
		}
	}
	return r, nil
}

// auditRollout reads the agents' requests since from from the API server's
// audit log into r.
func (f *fleetBench) auditRollout(r *fleetRun, k int, from time.Time, slots *slotTimeline) error {
	time.Sleep(500 * time.Millisecond) // the last responses' events are written
	evs, err := audit.Read(audit.LogPath(f.api.dir), from.Add(-time.Second), time.Time{}, audit.ByUserAgent("mig-agent/"))
	if err != nil {
		return err
	}
	r.AgentRequests, r.SlotLeaseRequests = map[string]int{}, map[string]int{}
	var slot, node int
	for _, e := range evs {
		key := e.Verb + " " + e.Resource()
		r.AgentRequests[key]++
		if e.Resource() != "leases" {
			continue
		}
		switch {
		case strings.HasPrefix(e.Name(), "mig-agent-slot-"):
			slot++
			r.SlotLeaseRequests[fmt.Sprintf("%s %d", e.Verb, e.Code())]++
		case strings.HasPrefix(e.Name(), "mig-agent-node-"):
			node++
		}
		if e.Code() == 409 {
			r.AgentLeaseConflicts++
		}
	}
	var holds, gaps, leadIns, tails []float64
	var timed []turns.Hold // the holds with when their node asked, for turns.ListSchedule
	asked := func(c slotChange) float64 {
		if tk := slots.ticket(c.holder); tk > 0 {
			return float64(tk - from.UnixMilli())
		}
		return ms(c.at.Sub(from))
	}
	var held, handedOff float64 // summed over the slots
	end := from.Add(time.Duration(r.RolloutSeconds * float64(time.Second)))
	changes := slots.since(from)
	for _, cs := range changes {
		// Per slot, its holders in time order: a hold runs from a
		// change to a holder until the next change; a gap from a change
		// to "" (released) until the next holder.
		leadIns = append(leadIns, ms(cs[0].at.Sub(from)))
		tails = append(tails, ms(end.Sub(cs[len(cs)-1].at)))
		for i := 0; i+1 < len(cs); i++ {
			d := ms(cs[i+1].at.Sub(cs[i].at))
			if cs[i].holder != "" {
				holds, held = append(holds, d), held+d
				timed = append(timed, turns.Hold{Asked: asked(cs[i]), Ms: d})
			} else {
				gaps, handedOff = append(gaps, d), handedOff+d
			}
		}
		if last := cs[len(cs)-1]; last.holder != "" {
			// Held to the end: its release had not reached the
			// bench's watch yet.
			d := ms(end.Sub(last.at))
			holds, held = append(holds, d), held+d
			timed = append(timed, turns.Hold{Asked: asked(last), Ms: d})
		}
	}
	r.HandOffs = countHandOffs(changes)
	r.SlotHoldMsMedian, r.HandOffMsMedian = median(holds), median(gaps)
	if len(changes) > 0 {
		// Where a slot's rollout time goes, on average over the slots:
		// before its first take, held, between a release and the next
		// take, and after its last release.
		per := float64(len(changes))
		r.SlotTime = &slotTime{LeadInMs: median(leadIns), HeldMs: held / per, HandOffMs: handedOff / per, TailMs: median(tails),
			HandOffMsMean: handedOff / max(float64(len(gaps)), 1), HandOffMsMax: slices.Max(append([]float64{0}, gaps...))}
		fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: a slot's rollout: %.0f ms before its first take, %.0f ms held, %.0f ms between holds (mean %.0f, max %.0f a hand-off), %.0f ms after its last release\n",
			k, r.MaxConcurrent, r.SlotTime.LeadInMs, r.SlotTime.HeldMs, r.SlotTime.HandOffMs, r.SlotTime.HandOffMsMean, r.SlotTime.HandOffMsMax, r.SlotTime.TailMs)
	}
	if r.SlotHoldMsMedian > 0 {
		rounds := (k + r.MaxConcurrent - 1) / r.MaxConcurrent
		r.RolloutOverHolds = r.RolloutSeconds * 1000 / (float64(rounds) * r.SlotHoldMsMedian)
		r.RolloutOverMakespan = r.RolloutSeconds * 1000 / (r.SlotTime.LeadInMs + float64(rounds)*held/float64(len(holds)))
		fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: rollout = %.2f × (lead-in %.0f ms + ⌈K/N⌉ × mean hold %.0f ms)\n",
			k, r.MaxConcurrent, r.RolloutOverMakespan, r.SlotTime.LeadInMs, held/float64(len(holds)))
		if m := turns.ListSchedule(r.MaxConcurrent, timed); m > 0 {
			r.RolloutOverListSchedule = r.RolloutSeconds * 1000 / m
			fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: rollout = %.2f × a perfect first come, first served semaphore with these nodes (%.0f ms)\n",
				k, r.MaxConcurrent, r.RolloutOverListSchedule, m)
		}
	}
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: slot held %.0f ms a node (median), hand-off %.0f ms (median); rollout = %.2f × ⌈K/N⌉ × hold\n",
		k, r.MaxConcurrent, r.SlotHoldMsMedian, r.HandOffMsMedian, r.RolloutOverHolds)
	r.SlotLeaseRequestsPerNode = float64(slot) / float64(k)
	r.NodeLeaseRequestsPerNode = float64(node) / float64(k)
	r.AgentRequestsPerNode = float64(len(evs)) / float64(k)
	if len(evs) > 0 {
		r.ConflictShare = float64(r.AgentLeaseConflicts) / float64(len(evs))
	}
	keys := make([]string, 0, len(r.AgentRequests))
	for key := range r.AgentRequests {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool { return r.AgentRequests[keys[i]] > r.AgentRequests[keys[j]] })
	var parts []string
	for _, key := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", key, float64(r.AgentRequests[key])/float64(k)))
	}
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: the agents' requests per node, from the audit log: %.1f (slot Leases %.2f, node Leases %.2f, %d lease 409s = %.1f%%): %s\n",
		k, r.MaxConcurrent, r.AgentRequestsPerNode, r.SlotLeaseRequestsPerNode, r.NodeLeaseRequestsPerNode, r.AgentLeaseConflicts, 100*r.ConflictShare, strings.Join(parts, ", "))
	fmt.Fprintf(os.Stderr, "fleet-bench: K=%d N=%d: slot Lease requests by verb and code: %s\n", k, r.MaxConcurrent, countsByKey(r.SlotLeaseRequests))
	return nil
}

func (f *fleetBench) label(ctx context.Context, node string) error {
	patch, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": node, "labels": map[string]any{record.LabelConfig: f.o.config}}})
	_, err := f.client.CoreV1().Nodes().Patch(ctx, node, "application/apply-patch+yaml", patch,
		metav1.PatchOptions{FieldManager: "pool-admin", Force: ptrTrue()})
	return err
}

func ptrTrue() *bool { t := true; return &t }

// waitStarted waits for every node's MigAgentStarted Event (one list of
// those Events a second).
func (f *fleetBench) waitStarted(ctx context.Context, names []string, procs []*proc, timeout time.Duration) error {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	deadline := time.Now().Add(timeout)
	for {
		evs, err := f.client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("reason", "MigAgentStarted").String()})
		if err == nil {
			for _, e := range evs.Items {
				delete(want, e.InvolvedObject.Name)
			}
			if len(want) == 0 {
				return nil
			}
		}
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("an agent exited at start:\n%s", p.output())
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d agents not started within %s", len(want), timeout)
		}
		time.Sleep(time.Second)
	}
}

// restartAPIServer stops kube-apiserver (etcd keeps running), waits down,
// starts it with the same command line and waits for /readyz, as
// testkit/kubetest's RestartAPIServer does for the tests.
func (f *fleetBench) restartAPIServer(down time.Duration) error {
	raw, err := os.ReadFile(filepath.Join(f.api.dir, "kube-apiserver.pid"))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return err
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return err
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(10 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(down)
	logf, err := os.OpenFile(filepath.Join(f.api.dir, "kube-apiserver.log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(f.api.dir, "kube-apiserver.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	go func() { _ = cmd.Wait() }()
	ready := time.Now().Add(2 * time.Minute)
	for time.Now().Before(ready) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		body, err := f.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("kube-apiserver not ready after the restart")
}

// parallel runs fn over items with at most workers at once; the first
// error wins.
func parallel(workers int, items []string, fn func(string) error) error {
	ch := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				if err := fn(it); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("%s: %w", it, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
	return first
}

// printFleet prints the fleet table (markdown, as docs/design/rollout-slots.md holds it).
func printFleet(w io.Writer, r *fleetResults) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| K nodes\t| N\t| rollout s\t| max disrupted\t| slot held ms\t| hand-off ms\t| rollout / (⌈K/N⌉ × held)\t| node time ms\t| rollout / (⌈K/N⌉ × node time)\t| rollout / (lead-in + ⌈K/N⌉ × mean hold)\t| rollout / perfect FCFS semaphore\t| agent req/node\t| slot Lease req/node\t| 409s (share)\t| most rounds late (asked)\t| most rounds late (began)\t| req/s idle\t| req first 10 s after outage\t| RssAnon sum MiB\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, x := range r.Runs {
		after := "—"
		if x.RequestsFirst10sAfter != nil {
			after = fmt.Sprintf("%.0f (after %.0f s down)", *x.RequestsFirst10sAfter, x.OutageSeconds)
		}
		fmt.Fprintf(tw, "| %d\t| %d\t| %.1f\t| %d\t| %.0f\t| %.0f\t| %.2f\t| %.0f\t| %.2f\t| %.2f\t| %.2f\t| %.1f\t| %.2f\t| %d (%.1f %%)\t| %.2f\t| %.2f\t| %.2f\t| %s\t| %.0f\t|\n", x.Nodes, x.MaxConcurrent, x.RolloutSeconds,
			x.MaxDisrupted, x.SlotHoldMsMedian, x.HandOffMsMedian, x.RolloutOverHolds, x.DisruptionMsMedian, x.RolloutOverNodeTime, x.RolloutOverMakespan, x.RolloutOverListSchedule, x.AgentRequestsPerNode, x.SlotLeaseRequestsPerNode,
			x.AgentLeaseConflicts, 100*x.ConflictShare, x.MaxRoundsLateByAsk, x.MaxRoundsLate, x.IdleRequestsPerSec, after, x.AgentRSSAnonMiBSum)
	}
	_ = tw.Flush()
	printSpread(w, r.Runs)
	fmt.Fprintf(w, "\nserver baseline (no agents): %.2f requests/s\n", r.ServerBaselinePerSec)
	for _, f := range r.Failures {
		fmt.Fprintln(w, "FAILED:", f)
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want positive integers, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// slotTime is where a slot's rollout time went: LeadInMs before its first
// take (the labels reaching the agents, their checks), HeldMs held and
// HandOffMs between holds (summed, averaged over the slots), TailMs after
// its last release (medians over the slots); a hand-off's mean and max.
type slotTime struct {
	LeadInMs      float64 `json:"leadInMs"`
	HeldMs        float64 `json:"heldMs"`
	HandOffMs     float64 `json:"handOffMs"`
	TailMs        float64 `json:"tailMs"`
	HandOffMsMean float64 `json:"handOffMsMean"`
	HandOffMsMax  float64 `json:"handOffMsMax"`
}

// printSpread prints, for each K and N run more than once, the median and
// the range of its figures over the runs.
func printSpread(w io.Writer, runs []fleetRun) {
	type cell struct{ k, n int }
	var order []cell
	by := map[cell][]fleetRun{}
	for _, x := range runs {
		c := cell{x.Nodes, x.MaxConcurrent}
		if _, ok := by[c]; !ok {
			order = append(order, c)
		}
		by[c] = append(by[c], x)
	}
	header := false
	for _, c := range order {
		xs := by[c]
		if len(xs) < 2 {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nspread over the runs of a cell: median (min–max)")
			fmt.Fprintln(w, "| K nodes | N | runs | rollout s | rollout / (⌈K/N⌉ × held) | rollout / (⌈K/N⌉ × node time) | rollout / (lead-in + ⌈K/N⌉ × mean hold) | rollout / perfect FCFS semaphore | hand-off ms | slot Lease req/node | 409 share % | most rounds late (asked) |")
			fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
			header = true
		}
		of := func(f func(fleetRun) float64, format string) string {
			v := make([]float64, len(xs))
			for i, x := range xs {
				v[i] = f(x)
			}
			return fmt.Sprintf(format+" ("+format+"–"+format+")", median(v), slices.Min(v), slices.Max(v))
		}
		fmt.Fprintf(w, "| %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.k, c.n, len(xs),
			of(func(x fleetRun) float64 { return x.RolloutSeconds }, "%.1f"),
			of(func(x fleetRun) float64 { return x.RolloutOverHolds }, "%.2f"),
			of(func(x fleetRun) float64 { return x.RolloutOverNodeTime }, "%.2f"),
			of(func(x fleetRun) float64 { return x.RolloutOverMakespan }, "%.2f"),
			of(func(x fleetRun) float64 { return x.RolloutOverListSchedule }, "%.2f"),
			of(func(x fleetRun) float64 { return x.HandOffMsMedian }, "%.0f"),
			of(func(x fleetRun) float64 { return x.SlotLeaseRequestsPerNode }, "%.2f"),
			of(func(x fleetRun) float64 { return 100 * x.ConflictShare }, "%.1f"),
			of(func(x fleetRun) float64 { return x.MaxRoundsLateByAsk }, "%.2f"))
	}
}

// countsByKey prints counts as "key n, ..." from the largest.
func countsByKey(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for key := range counts {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool {
		return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, key := range keys {
		parts[i] = fmt.Sprintf("%s %d", key, counts[key])
	}
	return strings.Join(parts, ", ")
}

// roundsLate is the most rounds any node waited past its turn, and how many
// waited more than two (fleetRun.MaxRoundsLate): a node's turn is its
// place by startedAt.
func roundsLate(recs []record.ChangeRecord, n int) (most float64, overTwo int) {
	var w []turns.Waited
	for _, r := range recs {
		if r.DisruptedAt != nil {
			w = append(w, turns.Waited{Turn: r.StartedAt, Took: *r.DisruptedAt})
		}
	}
	return turns.RoundsPast(w, n)
}
