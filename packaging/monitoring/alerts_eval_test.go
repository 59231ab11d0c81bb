package monitoring

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// goldenSeries turns the metrics golden file into a promqltest load block:
// every sample held for 30 minutes, with the instance label a scrape adds.
func goldenSeries(t *testing.T, instance string) string {
	t.Helper()
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
	var b strings.Builder
	b.WriteString("load 1m\n")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == "" || strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			t.Fatalf("cannot read %q", sc.Text())
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		ls := fmt.Sprintf("instance=%q", instance)
		if m[2] != "" {
			ls = m[2] + "," + ls
		}
		fmt.Fprintf(&b, "  %s{%s} %s+0x30\n", m[1], ls, strconv.FormatFloat(v, 'f', -1, 64))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// evalAlerts evaluates every alerting rule of groups once a minute from 0 to
// until over the series of script, as Prometheus' rule manager would, and
// returns the alerts firing at the end, by name.
func evalAlerts(t *testing.T, groups *rulefmt.RuleGroups, script string, until time.Duration) map[string]*rules.Alert {
	t.Helper()
	storage := promqltest.LoadedStorage(t, script)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000)
	query := rules.EngineQueryFunc(engine, storage)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	firing := map[string]*rules.Alert{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			expr, err := promql().ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
				labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", true, logger)
			for ts := time.Duration(0); ts <= until; ts += time.Minute {
				if _, err := rule.Eval(context.Background(), 0, time.Unix(0, 0).Add(ts), query, nil, 0); err != nil {
					t.Fatalf("%s at %v: %v", r.Alert, ts, err)
				}
			}
			for _, a := range rule.ActiveAlerts() {
				if a.State == rules.StateFiring {
					firing[r.Alert] = a
				}
			}
		}
	}
	return firing
}

func firingNames(m map[string]*rules.Alert) []string {
	var names []string
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TestAlertsFire evaluates the rules with Prometheus' own rule code: each
// alert fires on the condition it is named for, after its `for`, and not
// before.
func TestAlertsFire(t *testing.T) {
	groups, _ := loadRules(t)
	const healthy = `
load 1m
  migagent_state{instance="n1",state="success"} 1+0x40
  migagent_nvml_up{instance="n1"} 1+0x40
  migagent_geometry_drift{instance="n1"} 0+0x40
  migagent_reboot_guard_tripped{instance="n1"} 0+0x40
`
	tests := []struct {
		name   string
		script string
		at     time.Duration
		want   []string
	}{
		{"healthy", healthy, 40 * time.Minute, nil},
		{"pending 14m is not stuck", "load 1m\n  migagent_state{instance=\"n1\",state=\"pending\"} 1+0x40\n",
			14 * time.Minute, nil},
		{"pending 16m is stuck", "load 1m\n  migagent_state{instance=\"n1\",state=\"pending\"} 1+0x40\n",
			16 * time.Minute, []string{"MigAgentStuckPending"}},
		{"pending that moved on is not stuck",
			"load 1m\n  migagent_state{instance=\"n1\",state=\"pending\"} 1+0x9 0+0x4 1+0x30\n",
			20 * time.Minute, nil},
		{"failed", "load 1m\n  migagent_state{instance=\"n1\",state=\"failed\"} 1+0x40\n",
			6 * time.Minute, []string{"MigAgentFailed"}},
		{"drift", "load 1m\n  migagent_geometry_drift{instance=\"n1\"} 1+0x40\n",
			10 * time.Minute, []string{"MigAgentGeometryDrift"}},
		{"guard", "load 1m\n  migagent_reboot_guard_tripped{instance=\"n1\"} 1+0x40\n",
			time.Minute, []string{"MigAgentRebootGuardTripped"}},
		{"nvml down", "load 1m\n  migagent_nvml_up{instance=\"n1\"} 0+0x40\n",
			5 * time.Minute, []string{"MigAgentNVMLUnavailable"}},
		{"gpu unusable", "load 1m\n  migagent_gpu_unusable{instance=\"n1\",gpu=\"1\",error=\"ERROR_NO_PERMISSION\"} 1+0x40\n",
			10 * time.Minute, []string{"MigAgentGPUUnusable"}},
		{"gpu unusable for a moment", "load 1m\n  migagent_gpu_unusable{instance=\"n1\",gpu=\"1\",error=\"ERROR_GPU_IS_LOST\"} 1+0x5\n",
			10 * time.Minute, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := firingNames(evalAlerts(t, groups, tt.script, tt.at))
			if !slices.Equal(got, tt.want) {
				t.Errorf("firing %v, want %v", got, tt.want)
			}
		})
	}
}

// TestAlertsOnGolden evaluates the rules on the agent's golden /metrics
// text (a node whose second change failed, with GPU 2 unopenable):
// MigAgentFailed and MigAgentGPUUnusable fire, and the failure's
// description carries the reason from migagent_last_failure_info.
func TestAlertsOnGolden(t *testing.T) {
	groups, _ := loadRules(t)
	firing := evalAlerts(t, groups, goldenSeries(t, "gpu-node-1"), 10*time.Minute)
	if got := firingNames(firing); !slices.Equal(got, []string{"MigAgentFailed", "MigAgentGPUUnusable"}) {
		t.Fatalf("firing %v, want [MigAgentFailed MigAgentGPUUnusable]", got)
	}
	if s := firing["MigAgentGPUUnusable"].Annotations.Get("summary"); !strings.Contains(s, "GPU 2 on gpu-node-1") {
		t.Errorf("unusable GPU summary %q", s)
	}
	a := firing["MigAgentFailed"]
	desc := a.Annotations.Get("description")
	for _, want := range []string{"gpu-node-1", `Reason: config "all-3g.71gb" does not fit GPU 0`} {
		if !strings.Contains(desc, want) {
			t.Errorf("description %q lacks %q", desc, want)
		}
	}
	if s := a.Annotations.Get("summary"); !strings.Contains(s, "gpu-node-1") {
		t.Errorf("summary %q lacks the instance", s)
	}
	if a.Labels.Get("severity") != "warning" || a.Labels.Get("instance") != "gpu-node-1" {
		t.Errorf("labels %v", a.Labels)
	}
}
