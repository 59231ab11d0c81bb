package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

// repeat is one timed pod, on a fresh node.
type repeat struct {
	Node string `json:"node"`
	// From the pod's creation to: the scheduler's Unschedulable, the
	// planner's label on the node, the agent's success, the binding.
	CreatedToUnschedulableMs float64 `json:"createdToUnschedulableMs"`
	CreatedToLabelMs         float64 `json:"createdToLabelMs"`
	CreatedToSuccessMs       float64 `json:"createdToSuccessMs"`
	CreatedToBoundMs         float64 `json:"createdToBoundMs"`
	// UnschedulableToLabelMs is from when the bench saw the pod marked
	// unschedulable to when it saw the planner's label: the planner's own
	// latency (its watch, its round, its write).
	UnschedulableToLabelMs float64 `json:"unschedulableToLabelMs"`
	// APIRequests are the planner's requests from the pod's creation to
	// its binding, by "verb resource"; Decisions the changes it made then.
	APIRequests      map[string]int `json:"apiRequests"`
	APIRequestsTotal int            `json:"apiRequestsTotal"`
	Decisions        int            `json:"decisions"`
}

// results is the "planner" key of bench-results.json.
type results struct {
	Date            string   `json:"date"`
	Sim             string   `json:"sim"`
	PlannerInterval string   `json:"plannerInterval"`
	Repeats         []repeat `json:"repeats"`
	// Medians over the repeats.
	CreatedToBoundMsMedian   float64 `json:"createdToBoundMsMedian"`
	CreatedToLabelMsMedian   float64 `json:"createdToLabelMsMedian"`
	CreatedToSuccessMsMedian float64 `json:"createdToSuccessMsMedian"`
	// UnschedulableToLabelMsMedian and Max: the planner's latency, the
	// target 1 s on an idle machine.
	UnschedulableToLabelMsMedian float64 `json:"unschedulableToLabelMsMedian"`
	UnschedulableToLabelMsMax    float64 `json:"unschedulableToLabelMsMax"`
	// APIRequestsPerDecisionMedian is the median over the repeats of the
	// planner's requests in the window divided by its decisions there.
	APIRequestsPerDecisionMedian float64 `json:"apiRequestsPerDecisionMedian"`
	// The planner's requests with no pod pending.
	IdleAPIRequestsPerMin float64        `json:"idleApiRequestsPerMin"`
	IdleRequests          map[string]int `json:"idleRequests"`
	CPUs                  int            `json:"cpus"`
	LoadAvgBefore         float64        `json:"loadAvgBefore"`
	LoadAvgAfter          float64        `json:"loadAvgAfter"`
}

// summarize fills the medians from the repeats; a repeat without a
// decision counts for none in the requests per decision.
func (r *results) summarize() {
	var bound, label, success, perDecision, seen []float64
	for _, rep := range r.Repeats {
		seen = append(seen, rep.UnschedulableToLabelMs)
		bound = append(bound, rep.CreatedToBoundMs)
		label = append(label, rep.CreatedToLabelMs)
		success = append(success, rep.CreatedToSuccessMs)
		if rep.Decisions > 0 {
			perDecision = append(perDecision, float64(rep.APIRequestsTotal)/float64(rep.Decisions))
		}
	}
	r.CreatedToBoundMsMedian, r.CreatedToLabelMsMedian, r.CreatedToSuccessMsMedian = median(bound), median(label), median(success)
	r.APIRequestsPerDecisionMedian = median(perDecision)
	r.UnschedulableToLabelMsMedian = median(seen)
	if len(seen) > 0 {
		r.UnschedulableToLabelMsMax = slices.Max(seen)
	}
}

func (r *results) print(w io.Writer) {
	fmt.Fprintf(w, "\nplanner: a pod asking for nvidia.com/mig-%s that no node offers, on a fresh opted-in node of %s without GPU Feature Discovery's labels (planned from its agent's published GPUs), --planner-interval %s (%d CPUs, load %.1f → %.1f)\n",
		profile, r.Sim, r.PlannerInterval, r.CPUs, r.LoadAvgBefore, r.LoadAvgAfter)
	for i, rep := range r.Repeats {
		fmt.Fprintf(w, "  repeat %d: unschedulable %6.0f ms  label %6.0f ms (%4.0f ms after unschedulable)  agent success %6.0f ms  bound %6.0f ms  planner requests %3d (%s), decisions %d\n",
			i+1, rep.CreatedToUnschedulableMs, rep.CreatedToLabelMs, rep.UnschedulableToLabelMs, rep.CreatedToSuccessMs, rep.CreatedToBoundMs,
			rep.APIRequestsTotal, requestsText(rep.APIRequests), rep.Decisions)
	}
	fmt.Fprintf(w, "  median of %d: pod created → label %.0f ms → agent success %.0f ms → bound %.0f ms; planner API requests per decision %.1f\n",
		len(r.Repeats), r.CreatedToLabelMsMedian, r.CreatedToSuccessMsMedian, r.CreatedToBoundMsMedian, r.APIRequestsPerDecisionMedian)
	fmt.Fprintf(w, "  planner latency, pod unschedulable → label set (the planner watches pods; target 1 s): median %.0f ms, max %.0f ms\n",
		r.UnschedulableToLabelMsMedian, r.UnschedulableToLabelMsMax)
	fmt.Fprintf(w, "  planner idle: %.1f API requests/min (%s)\n", r.IdleAPIRequestsPerMin, requestsText(r.IdleRequests))
}

// countRequests counts audit events by "verb resource", watches aside.
func countRequests(evs []audit.Event) (map[string]int, int) {
	out, total := map[string]int{}, 0
	for _, e := range evs {
		if e.Verb == "watch" {
			continue
		}
		out[e.Verb+" "+e.Resource()]++
		total++
	}
	return out, total
}

func requestsText(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return float64(d.Microseconds()) / 1000
}

// metricValue reads one sample of Prometheus text exposition: the line
// that starts with series (name and labels, as exposed) and a space; 0
// where there is none.
func metricValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err == nil {
				return f
			}
		}
	}
	return 0
}
