// Command bench measures mig-agent against its targets (`make bench`): the
// latency from a label to pending and to success on a real kube-apiserver,
// NVML mutations against the minimum and against a teardown, evictions
// against the pods on the changed GPU, the agent's memory, and the API
// requests one idle agent sends. It starts its own API server
// (hack/kube-apiserver.sh), runs the built binary (bin/mig-agent), prints
// a table and writes bench-results.json. See docs/bench.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/testkit/benchfile"
)

// results is bench-results.json.
type results struct {
	Date    string `json:"date"`
	Commit  string `json:"commit"`
	Machine string `json:"machine"`

	LabelToPendingMsMedian float64   `json:"labelToPendingMsMedian"`
	LabelToSuccessMsMedian float64   `json:"labelToSuccessMsMedian"`
	LabelToPendingMs       []float64 `json:"labelToPendingMs"`
	LabelToSuccessMs       []float64 `json:"labelToSuccessMs"`
	// LabelPatchMs is how long the label patch itself took (part of both).
	LabelPatchMs []float64 `json:"labelPatchMs"`
	// The spread of the repeats: 25th and 75th percentiles, least, most.
	LabelToPendingSpread spread `json:"labelToPendingSpread"`
	LabelToSuccessSpread spread `json:"labelToSuccessSpread"`
	// Steps is the median time of each step of a change over the repeats,
	// from the agent's debug log ("step done"), in the checklist's order;
	// "label → checklist" is from the label patch to the first step.
	Steps []stepTime `json:"steps"`
	// LoadAvg is the machine's 1-minute load average before and after the
	// timed changes (/proc/loadavg), against its CPUs: a loaded machine
	// stretches every figure.
	LoadAvgBefore float64 `json:"loadAvgBefore"`
	LoadAvgAfter  float64 `json:"loadAvgAfter"`
	CPUs          int     `json:"cpus"`

	// BinaryBytes is the size of the agent binary measured.
	BinaryBytes int64 `json:"binaryBytes"`

	NVMLMutationsOurs     int                   `json:"nvmlMutationsOurs"`
	NVMLMutationsMinimum  int                   `json:"nvmlMutationsMinimum"`
	NVMLMutationsTeardown int                   `json:"nvmlMutationsTeardown"`
	NVMLTransitions       []transitionMutations `json:"nvmlTransitions"`

	EvictedPodsOneGPUChange int `json:"evictedPodsOneGPUChange"`
	PodsOnChangedGPU        int `json:"podsOnChangedGPU"`
	EvictedPodsWholeNode    int `json:"evictedPodsWholeNode"`
	PodsOnNode              int `json:"podsOnNode"`

	RSSMiB                float64        `json:"rssMiB"`
	RSSAnonMiB            float64        `json:"rssAnonMiB"`
	RSSFileMiB            float64        `json:"rssFileMiB"`
	IdleAPIRequestsPerMin float64        `json:"idleApiRequestsPerMin"`
	IdleWindowSeconds     float64        `json:"idleWindowSeconds"`
	IdleRequests          map[string]int `json:"idleRequests"`
	IdleExcluded          map[string]int `json:"idleExcluded"`

	// NodeAnnotationBytes is what the agent's annotations weigh on the
	// Node after the timed label changes (kube.AnnotationBytes: keys and
	// values); NodeRecordBytes the same with the condition MIGConfigReady
	// (kube.Footprint); HistoryConfigMapBytes the history that the
	// ConfigMap <node>-mig-history holds whole then.
	NodeAnnotationBytes   int `json:"nodeAnnotationBytes"`
	NodeRecordBytes       int `json:"nodeRecordBytes"`
	HistoryConfigMapBytes int `json:"historyConfigMapBytes"`

	Targets map[string]bool `json:"targets"`
}

type options struct {
	agent, script, out string
	changes            int
	pause              time.Duration
	idle               time.Duration
	strict             bool
	fleet              bool
	fleetLogDir        string
	fleetLogLevel      string
	fleetK, fleetN     string
	fleetIdle          time.Duration
	fleetOutage        time.Duration
	fleetOutageAll     bool
	fleetRepeat        int
	fleetStride        time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.agent, "agent", "bin/mig-agent", "the mig-agent binary to measure")
	flag.StringVar(&o.script, "apiserver-script", "hack/kube-apiserver.sh", "the script that runs kube-apiserver and etcd")
	flag.StringVar(&o.out, "o", "bench-results.json", "results file")
	flag.IntVar(&o.changes, "changes", 20, "label changes timed (all-disabled ↔ all-balanced); the medians are over them")
	flag.DurationVar(&o.pause, "pause", time.Second, "pause between timed label changes, so that each is timed alone (back to back, the agent's client-side rate limit of 50 requests/s, burst 100, is reached after about 15 changes)")
	flag.DurationVar(&o.idle, "idle", 5*time.Minute, "how long the idle agent's API requests are counted")
	flag.BoolVar(&o.strict, "strict", false, "exit 1 when a target is missed")
	flag.BoolVar(&o.fleet, "fleet", false, "run the fleet bench instead (make fleet-bench): K agents on one API server, a pool-wide change, per --max-concurrent N; its figures go to the \"fleet\" key of the results file")
	flag.StringVar(&o.fleetK, "fleet-k", "10,20", "fleet bench: numbers of nodes K, comma-separated")
	flag.StringVar(&o.fleetN, "fleet-n", "1,10,50", "fleet bench: values of --max-concurrent N, comma-separated")
	flag.DurationVar(&o.fleetIdle, "fleet-idle", 15*time.Second, "fleet bench: how long the idle fleet's requests are counted after each rollout")
	flag.DurationVar(&o.fleetOutage, "fleet-outage", 30*time.Second, "fleet bench: API server outage after the last N of each K (0: none)")
	flag.BoolVar(&o.fleetOutageAll, "fleet-outage-every-run", false, "fleet bench: an outage after every run, not only after the last N of each K")
	flag.IntVar(&o.fleetRepeat, "fleet-repeat", 1, "fleet bench: runs of each K and N; with more than one, the spread of each cell is printed after the table")
	flag.DurationVar(&o.fleetStride, "fleet-start-stride", 50*time.Millisecond, "fleet bench: pause between agent starts")
	flag.StringVar(&o.fleetLogDir, "fleet-log-dir", "", "fleet bench: write each agent's log to DIR/<node>.log")
	flag.StringVar(&o.fleetLogLevel, "fleet-log-level", "warn", "fleet bench: the agents' --log-level")
	flag.Parse()
	if o.fleet {
		if err := fleetMain(context.Background(), o, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fleet-bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, w io.Writer) error {
	agentBin, err := filepath.Abs(o.agent)
	if err != nil {
		return err
	}
	if _, err := os.Stat(agentBin); err != nil {
		return fmt.Errorf("the agent binary: %w (run make build)", err)
	}
	work, err := os.MkdirTemp("", "mig-agent-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	cfgFile := filepath.Join(work, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(oneGPUConfig), 0o644); err != nil {
		return err
	}
	r := &results{Date: time.Now().UTC().Format(time.RFC3339), Commit: gitCommit(), Machine: machine(), Targets: map[string]bool{},
		CPUs: runtime.NumCPU()}
	if fi, err := os.Stat(agentBin); err == nil {
		r.BinaryBytes = fi.Size()
	}

	fmt.Fprintln(os.Stderr, "bench: NVML mutations (in process, simulated H200x8)")
	mf, err := runMutations(cfgFile)
	if err != nil {
		return fmt.Errorf("mutations: %w", err)
	}
	r.NVMLMutationsOurs, r.NVMLMutationsMinimum, r.NVMLMutationsTeardown, r.NVMLTransitions = mf.Ours, mf.Minimum, mf.Teardown, mf.PerTransition

	fmt.Fprintln(os.Stderr, "bench: starting kube-apiserver")
	api, err := startAPIServer(ctx, o.script)
	if err != nil {
		return err
	}
	defer api.stop()
	b := &bench{api: api, agentBin: agentBin, work: work, cfgFile: cfgFile}

	fmt.Fprintf(os.Stderr, "bench: %d label changes on sim:h200x8\n", o.changes)
	idleAgent, err := b.latency(ctx, o.changes, o.pause, r)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	defer idleAgent.stop()

	fmt.Fprintln(os.Stderr, "bench: evictions (8 GPUs, 2 pods each, one GPU changed)")
	if r.EvictedPodsOneGPUChange, r.PodsOnChangedGPU, r.PodsOnNode, err = b.evictions(ctx, true); err != nil {
		return fmt.Errorf("evictions: %w", err)
	}
	if r.EvictedPodsWholeNode, _, _, err = b.evictions(ctx, false); err != nil {
		return fmt.Errorf("evictions without PodResources: %w", err)
	}

	fmt.Fprintf(os.Stderr, "bench: idle agent for %s\n", o.idle)
	if err := b.idle(ctx, idleAgent, o.idle, r); err != nil {
		return fmt.Errorf("idle: %w", err)
	}

	r.Targets["labelToPendingMsMedian<20"] = r.LabelToPendingMsMedian < 20
	r.Targets["labelToSuccessMsMedian<150"] = r.LabelToSuccessMsMedian < 150
	r.Targets["nvmlMutationsOurs==nvmlMutationsMinimum"] = r.NVMLMutationsOurs == r.NVMLMutationsMinimum
	r.Targets["evictedPodsOneGPUChange==podsOnChangedGPU"] = r.EvictedPodsOneGPUChange == r.PodsOnChangedGPU
	r.Targets["rssMiB<35"] = r.RSSMiB < 35
	r.Targets["rssAnonMiB<=10"] = r.RSSAnonMiB <= 10
	r.Targets["binaryBytes<32MB"] = r.BinaryBytes < 32e6
	r.Targets["idleApiRequestsPerMin<1"] = r.IdleAPIRequestsPerMin < 1
	r.Targets["nodeAnnotationBytes<=4KiB"] = r.NodeAnnotationBytes <= kube.AnnotationBudget

	// Merged into the file: the fleet bench's section stays.
	if err := writeMerged(o.out, r); err != nil {
		return err
	}
	printTable(w, r)
	fmt.Fprintf(w, "\nresults written to %s\n", o.out)
	var missed []string
	for name, ok := range r.Targets {
		if !ok {
			missed = append(missed, name)
		}
	}
	sort.Strings(missed)
	if len(missed) > 0 && o.strict {
		return fmt.Errorf("targets missed: %s", strings.Join(missed, ", "))
	}
	return nil
}

func printTable(w io.Writer, r *results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	verdict := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "MISSED"
	}
	fmt.Fprintln(tw, "measure\tvalue\ttarget\t")
	fmt.Fprintf(tw, "machine load (1-min average, %d CPUs)\t%.2f before, %.2f after\t\t\n", r.CPUs, r.LoadAvgBefore, r.LoadAvgAfter)
	fmt.Fprintf(tw, "label → pending (median of %d)\t%.1f ms\t< 20 ms %s\t\n", len(r.LabelToPendingMs), r.LabelToPendingMsMedian, verdict(r.Targets["labelToPendingMsMedian<20"]))
	fmt.Fprintf(tw, "  spread: p25–p75, min–max\t%s\t\t\n", r.LabelToPendingSpread)
	fmt.Fprintf(tw, "label → success (median of %d)\t%.1f ms\t< 150 ms %s\t\n", len(r.LabelToSuccessMs), r.LabelToSuccessMsMedian, verdict(r.Targets["labelToSuccessMsMedian<150"]))
	fmt.Fprintf(tw, "  spread: p25–p75, min–max\t%s\t\t\n", r.LabelToSuccessSpread)
	fmt.Fprintf(tw, "  label patch (median)\t%.1f ms\t\t\n", median(r.LabelPatchMs))
	for _, st := range r.Steps {
		fmt.Fprintf(tw, "  step %s (median)\t%.1f ms\t\t\n", st.Step, st.MsMedian)
	}
	fmt.Fprintf(tw, "the agent's annotations on the Node after %d changes\t%d bytes\t≤ 4 KiB %s\t\n", len(r.LabelToSuccessMs), r.NodeAnnotationBytes, verdict(r.Targets["nodeAnnotationBytes<=4KiB"]))
	fmt.Fprintf(tw, "  with the condition MIGConfigReady\t%d bytes\t\t\n", r.NodeRecordBytes)
	fmt.Fprintf(tw, "  the whole history, in its ConfigMap\t%d\t\t\n", r.HistoryConfigMapBytes)
	fmt.Fprintf(tw, "NVML mutations, mig-agent (%d transitions)\t%d\t= minimum %s\t\n", len(r.NVMLTransitions), r.NVMLMutationsOurs, verdict(r.Targets["nvmlMutationsOurs==nvmlMutationsMinimum"]))
	fmt.Fprintf(tw, "NVML mutations, minimum\t%d\t\t\n", r.NVMLMutationsMinimum)
	fmt.Fprintf(tw, "NVML mutations, teardown (mig-parted)\t%d\t\t\n", r.NVMLMutationsTeardown)
	fmt.Fprintf(tw, "evicted pods, one GPU of 8 changed\t%d\t= %d pods on it %s\t\n", r.EvictedPodsOneGPUChange, r.PodsOnChangedGPU, verdict(r.Targets["evictedPodsOneGPUChange==podsOnChangedGPU"]))
	fmt.Fprintf(tw, "evicted pods, whole-node drain\t%d\tof %d on the node\t\n", r.EvictedPodsWholeNode, r.PodsOnNode)
	fmt.Fprintf(tw, "agent binary\t%.1f MB\t< 32 MB %s\t\n", float64(r.BinaryBytes)/1e6, verdict(r.Targets["binaryBytes<32MB"]))
	fmt.Fprintf(tw, "agent RSS (VmRSS), steady state\t%.1f MiB\t< 35 MiB %s\t\n", r.RSSMiB, verdict(r.Targets["rssMiB<35"]))
	fmt.Fprintf(tw, "  of it anonymous (heap, stacks)\t%.1f MiB\t≤ 10 MiB %s\t\n", r.RSSAnonMiB, verdict(r.Targets["rssAnonMiB<=10"]))
	fmt.Fprintf(tw, "  of it the mapped binary (file)\t%.1f MiB\t\t\n", r.RSSFileMiB)
	fmt.Fprintf(tw, "API requests of an idle agent\t%.2f /min\t< 1/min %s\t\n", r.IdleAPIRequestsPerMin, verdict(r.Targets["idleApiRequestsPerMin<1"]))
	_ = tw.Flush()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is how repeats of one measure scatter.
type spread struct {
	P25 float64 `json:"p25"`
	P75 float64 `json:"p75"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

func (s spread) String() string {
	return fmt.Sprintf("%.1f–%.1f ms, %.1f–%.1f ms", s.P25, s.P75, s.Min, s.Max)
}

// spreadOf is xs's spread (percentiles by the nearest rank).
func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	rank := func(p float64) float64 { return s[int(p*float64(len(s)-1)+0.5)] }
	return spread{P25: rank(0.25), P75: rank(0.75), Min: s[0], Max: s[len(s)-1]}
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func machine() string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(l[strings.Index(l, ":")+1:])
				break
			}
		}
	}
	n := 0
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n = strings.Count(string(data), "processor\t:")
	}
	return cpu + ", " + strconv.Itoa(n) + " CPUs"
}

// fleetMain runs the fleet bench (make fleet-bench).
func fleetMain(ctx context.Context, o options, w io.Writer) error {
	agentBin, err := filepath.Abs(o.agent)
	if err != nil {
		return err
	}
	if _, err := os.Stat(agentBin); err != nil {
		return fmt.Errorf("the agent binary: %w (run make build)", err)
	}
	fo := fleetOptions{logDir: o.fleetLogDir, logLevel: o.fleetLogLevel, idle: o.fleetIdle, outage: o.fleetOutage, outageAll: o.fleetOutageAll, config: "all-balanced",
		leaseDur: time.Minute, startStride: o.fleetStride, repeat: max(o.fleetRepeat, 1)}
	if fo.ks, err = parseInts(o.fleetK); err != nil {
		return err
	}
	if fo.ns, err = parseInts(o.fleetN); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "mig-agent-fleet-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	fmt.Fprintln(os.Stderr, "fleet-bench: starting kube-apiserver")
	// The audit log counts the agents' requests by name (slot or node
	// Lease) and by resource (hack/kube-apiserver.sh, KUBE_TEST_AUDIT).
	if err := os.Setenv("KUBE_TEST_AUDIT", "all"); err != nil {
		return err
	}
	api, err := startAPIServer(ctx, o.script)
	if err != nil {
		return err
	}
	defer api.stop()
	res, err := runFleet(ctx, api, agentBin, work, fo)
	if err != nil {
		return err
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if err := benchfile.Merge(o.out, map[string]json.RawMessage{"fleet": data}); err != nil {
		return err
	}
	printFleet(w, res)
	fmt.Fprintf(w, "\nresults written to %s (key \"fleet\")\n", o.out)
	if len(res.Failures) > 0 {
		return fmt.Errorf("%d runs failed: %s", len(res.Failures), strings.Join(res.Failures, "; "))
	}
	return nil
}

// writeMerged writes v's fields into the JSON object in path, keeping the
// keys v does not have.
func writeMerged(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fields := map[string]json.RawMessage{}
	if err := json.Unmarshal(data, &fields); err != nil {
		return err
	}
	return benchfile.Merge(path, fields)
}
