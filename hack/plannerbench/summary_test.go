package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/testkit/kubetest/audit"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{9, 1, 8, 2, 7}, 7}} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

// The medians over the repeats; requests per decision counts only the
// repeats with a decision.
func TestSummarize(t *testing.T) {
	r := &results{Repeats: []repeat{
		{CreatedToLabelMs: 900, CreatedToSuccessMs: 1500, CreatedToBoundMs: 2100, APIRequestsTotal: 12, Decisions: 1},
		{CreatedToLabelMs: 5100, CreatedToSuccessMs: 5700, CreatedToBoundMs: 6000, APIRequestsTotal: 30, Decisions: 1},
		{CreatedToLabelMs: 3000, CreatedToSuccessMs: 3600, CreatedToBoundMs: 4000, APIRequestsTotal: 40, Decisions: 2},
		{CreatedToLabelMs: 100, CreatedToSuccessMs: 200, CreatedToBoundMs: 300, APIRequestsTotal: 99, Decisions: 0},
	}}
	r.summarize()
	if r.CreatedToBoundMsMedian != 3050 || r.CreatedToLabelMsMedian != 1950 || r.CreatedToSuccessMsMedian != 2550 {
		t.Errorf("medians: bound %v label %v success %v", r.CreatedToBoundMsMedian, r.CreatedToLabelMsMedian, r.CreatedToSuccessMsMedian)
	}
	if r.APIRequestsPerDecisionMedian != 20 { // 12, 30, 20
		t.Errorf("requests per decision %v, want 20", r.APIRequestsPerDecisionMedian)
	}
	var out bytes.Buffer
	r.print(&out)
	if !strings.Contains(out.String(), "median of 4: pod created → label 1950 ms → agent success 2550 ms → bound 3050 ms; planner API requests per decision 20.0") {
		t.Errorf("printed:\n%s", out.String())
	}
}

// Requests counted by verb and resource, watches aside, from audit lines as
// the API server writes them.
func TestCountRequests(t *testing.T) {
	lines := []string{
		`{"verb":"list","userAgent":"mig-agent-planner/1.0","objectRef":{"resource":"pods"},"stage":"ResponseComplete"}`,
		`{"verb":"list","userAgent":"mig-agent-planner/1.0","objectRef":{"resource":"nodes"},"stage":"ResponseComplete"}`,
		`{"verb":"list","userAgent":"mig-agent-planner/1.0","objectRef":{"resource":"pods"},"stage":"ResponseComplete"}`,
		`{"verb":"patch","userAgent":"mig-agent-planner/1.0","objectRef":{"resource":"nodes","name":"n1"},"stage":"ResponseComplete"}`,
		`{"verb":"watch","userAgent":"mig-agent-planner/1.0","objectRef":{"resource":"nodes"},"stage":"ResponseComplete"}`,
	}
	var evs []audit.Event
	for _, l := range lines {
		var e audit.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	by, total := countRequests(evs)
	if total != 4 || by["list pods"] != 2 || by["list nodes"] != 1 || by["patch nodes"] != 1 || len(by) != 3 {
		t.Errorf("countRequests = %v, %d", by, total)
	}
	if got := requestsText(by); got != "list nodes 1, list pods 2, patch nodes 1" {
		t.Errorf("requestsText = %q", got)
	}
}

func TestMetricValue(t *testing.T) {
	text := `# HELP migagent_planner_decisions_total Decisions.
# TYPE migagent_planner_decisions_total counter
migagent_planner_decisions_total{result="changed"} 3
migagent_planner_decisions_total{result="unservable"} 1
migagent_planner_leader 1
`
	if v := decisions(text); v != 3 {
		t.Errorf("decisions = %v", v)
	}
	if v := metricValue(text, "migagent_planner_leader"); v != 1 {
		t.Errorf("leader = %v", v)
	}
	if v := metricValue(text, "migagent_planner_unservable_pods"); v != 0 {
		t.Errorf("absent = %v", v)
	}
}

// merge keeps the other benches' keys.
func TestMerge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench-results.json")
	if err := os.WriteFile(path, []byte(`{"assignments":{"pods":50}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := merge(path, &results{Sim: "sim:h200x1", CreatedToBoundMsMedian: 1234}); err != nil {
		t.Fatal(err)
	}
	var doc map[string]map[string]any
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["assignments"]["pods"] != float64(50) || doc["planner"]["createdToBoundMsMedian"] != float64(1234) {
		t.Errorf("merged: %s", b)
	}
}
