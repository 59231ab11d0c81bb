package monitoring

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

const (
	rulesFile     = "alerts.rules.yaml"
	operatorFile  = "prometheusrule.yaml"
	dashboardFile = "mig-agent-dashboard.json"
	goldenFile    = "../../metrics/testdata/metrics.golden"
)

// targetLabels are added by Prometheus at scrape time (or by relabeling), so
// they are not in the agent's own /metrics text.
var targetLabels = []string{"instance", "job", "namespace", "pod", "node"}

func promql() parser.Parser { return parser.NewParser(parser.Options{}) }

// golden is what the agent's /metrics text holds: for each sample name
// (histogram _bucket/_sum/_count included), each label name and the values
// it takes.
type golden map[string]map[string][]string

func readGolden(t *testing.T) golden {
	t.Helper()
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatalf("%v (the metrics package's golden file)", err)
	}
	defer f.Close()
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$`)
	pair := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	g := golden{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sample.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%s: cannot read line %q", goldenFile, line)
		}
		if g[m[1]] == nil {
			g[m[1]] = map[string][]string{}
		}
		for _, p := range pair.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(g[m[1]][p[1]], p[2]) {
				g[m[1]][p[1]] = append(g[m[1]][p[1]], p[2])
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(g) == 0 {
		t.Fatalf("%s holds no samples", goldenFile)
	}
	return g
}

// checkExpr reports the problems exprProblems finds.
func checkExpr(t *testing.T, where, expr string, g golden) {
	t.Helper()
	for _, p := range exprProblems(where, expr, g, false) {
		t.Error(p)
	}
}

// exprProblems parses expr and checks that every series selector names a
// metric of the golden file, with label names it has and, for = matchers,
// values it takes. With foreign, metrics not named migagent_* (DCGM's, say)
// are let through unchecked.
func exprProblems(where, expr string, g golden, foreign bool) []string {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	e, err := promql().ParseExpr(expr)
	if err != nil {
		fail("%s: %q does not parse: %v", where, expr, err)
		return problems
	}
	selectors := 0
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		if foreign && !strings.HasPrefix(vs.Name, "migagent_") {
			return nil
		}
		known, ok := g[vs.Name]
		if !ok {
			fail("%s: metric %q is not in %s", where, vs.Name, goldenFile)
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName || slices.Contains(targetLabels, m.Name) {
				continue
			}
			values, ok := known[m.Name]
			if !ok {
				fail("%s: %s has no label %q", where, vs.Name, m.Name)
				continue
			}
			if m.Type == labels.MatchEqual && !slices.Contains(values, m.Value) {
				fail("%s: %s{%s=%q}: the golden file has only %q", where, vs.Name, m.Name, m.Value, values)
			}
		}
		return nil
	})
	if selectors == 0 {
		fail("%s: %q selects no metric", where, expr)
	}
	return problems
}

func parseRules(t *testing.T, name string, content []byte) *rulefmt.RuleGroups {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	groups, errs := rulefmt.Parse(content, false, model.LegacyValidation, promql(), logger)
	for _, err := range errs {
		t.Errorf("%s: %v", name, err)
	}
	if groups == nil {
		t.Fatalf("%s: no rule groups", name)
	}
	return groups
}

func loadRules(t *testing.T) (plain, operator *rulefmt.RuleGroups) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	plain = parseRules(t, rulesFile, b)

	b, err = os.ReadFile(operatorFile)
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec yaml.Node `yaml:"spec"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&manifest); err != nil {
		t.Fatalf("%s: %v", operatorFile, err)
	}
	if manifest.APIVersion != "monitoring.coreos.com/v1" || manifest.Kind != "PrometheusRule" || manifest.Metadata.Name == "" {
		t.Errorf("%s: apiVersion %q kind %q name %q, want monitoring.coreos.com/v1 PrometheusRule and a name",
			operatorFile, manifest.APIVersion, manifest.Kind, manifest.Metadata.Name)
	}
	spec, err := yaml.Marshal(&manifest.Spec)
	if err != nil {
		t.Fatal(err)
	}
	operator = parseRules(t, operatorFile+" spec", spec)
	return plain, operator
}

func TestRuleFilesHoldTheSameRules(t *testing.T) {
	plain, operator := loadRules(t)
	if !reflect.DeepEqual(plain, operator) {
		t.Errorf("%s and %s differ:\n%+v\n%+v", rulesFile, operatorFile, plain, operator)
	}
}

func TestAlerts(t *testing.T) {
	plain, _ := loadRules(t)
	g := readGolden(t)
	want := map[string]struct {
		minFor time.Duration
		expr   string // a substring the expression must hold
	}{
		"MigAgentStuckPending":       {15 * time.Minute, `migagent_state{state="pending"}`},
		"MigAgentFailed":             {0, `migagent_state{state="failed"}`},
		"MigAgentGeometryDrift":      {0, `migagent_geometry_drift`},
		"MigAgentRebootGuardTripped": {0, `migagent_reboot_guard_tripped`},
		"MigAgentNVMLUnavailable":    {0, `migagent_nvml_up`},
		"MigAgentGPUUnusable":        {5 * time.Minute, `migagent_gpu_unusable`},
	}
	seen := map[string]bool{}
	for _, group := range plain.Groups {
		for _, r := range group.Rules {
			where := group.Name + "/" + r.Alert + r.Record
			checkExpr(t, where, r.Expr, g)
			e, err := promql().ParseExpr(r.Expr)
			if err == nil && e.Type() != parser.ValueTypeVector {
				t.Errorf("%s: expression of type %s, want an instant vector", where, e.Type())
			}
			if r.Alert == "" {
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s: alert defined twice", where)
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", where, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", where, a)
				}
			}
			w, ok := want[r.Alert]
			if !ok {
				continue
			}
			if time.Duration(r.For) < w.minFor {
				t.Errorf("%s: for %v, want at least %v", where, time.Duration(r.For), w.minFor)
			}
			if !strings.Contains(r.Expr, w.expr) {
				t.Errorf("%s: expr %q does not use %s", where, r.Expr, w.expr)
			}
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("alert %s missing from %s", name, rulesFile)
		}
	}
}

// grafanaVars are Grafana's interval variables, which PromQL cannot parse
// where a duration goes; any duration stands in for them.
var grafanaVars = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)

type dashPanel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // of a collapsed row
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string      `json:"uid"`
		Title      string      `json:"title"`
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard uid %q title %q: both needed", dash.UID, dash.Title)
	}
	g := readGolden(t)

	var all []dashPanel
	for _, p := range dash.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	ids := map[int]bool{}
	var queries int
	for i, p := range all {
		where := dashboardFile + ": panel " + p.Title
		if ids[p.ID] {
			t.Errorf("%s: id %d used twice", where, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", where, p.GridPos)
		}
		for _, q := range all[:i] {
			a, c := p.GridPos, q.GridPos
			if a.X < c.X+c.W && c.X < a.X+a.W && a.Y < c.Y+c.H && c.Y < a.Y+a.H {
				t.Errorf("%s overlaps panel %s", where, q.Title)
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || p.Description == "" {
			t.Errorf("%s: needs a title and a description", where)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if refs[tg.RefID] {
				t.Errorf("%s: refId %q used twice", where, tg.RefID)
			}
			refs[tg.RefID] = true
			queries++
			checkExpr(t, where, grafanaVars.ReplaceAllString(tg.Expr, "5m"), g)
		}
	}
	if queries == 0 {
		t.Fatal("dashboard has no queries")
	}

	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: definition %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		if _, ok := g[m[1]]; !ok {
			t.Errorf("variable %s: metric %s is not in %s", v.Name, m[1], goldenFile)
		}
	}
}

// TestCheckExprCatchesMistakes makes sure the checks above can fail.
func TestCheckExprCatchesMistakes(t *testing.T) {
	g := readGolden(t)
	tests := []struct{ expr, problem string }{
		{`migagent_state{state="pendng"} == 1`, `the golden file has only`},
		{`migagent_stat == 1`, `metric "migagent_stat" is not in`},
		{`migagent_state{State="pending"}`, `has no label "State"`},
		{`sum by (state) (migagent_state`, `does not parse`},
		{`vector(1)`, `selects no metric`},
	}
	for _, tt := range tests {
		got := exprProblems("probe", tt.expr, g, false)
		if len(got) != 1 || !strings.Contains(got[0], tt.problem) {
			t.Errorf("exprProblems(%q) = %q, want one problem with %q", tt.expr, got, tt.problem)
		}
	}
	if got := exprProblems("probe", `sum by (state) (migagent_state{state="failed",instance=~".*"})`, g, false); len(got) != 0 {
		t.Errorf("a good expression got problems: %q", got)
	}
}

// TestDocQueries parses the PromQL examples of docs/observability.md (the
// lines of its promql code blocks) and checks the mig-agent names they use.
func TestDocQueries(t *testing.T) {
	const doc = "../../docs/observability.md"
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	g := readGolden(t)
	in, n := false, 0
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```promql"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in && strings.TrimSpace(line) != "" && !strings.HasPrefix(strings.TrimSpace(line), "#"):
			n++
			for _, p := range exprProblems(fmt.Sprintf("%s:%d", doc, i+1), line, g, true) {
				t.Error(p)
			}
		}
	}
	if n == 0 {
		t.Errorf("%s: no promql examples found", doc)
	}
}
