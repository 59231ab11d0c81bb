package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// The planner's metrics keep their names and text, lint clean, both
// decisions present from the start.
func TestPlannerMetrics(t *testing.T) {
	m := NewPlanner()
	m.Decision("changed")
	m.UnservablePods(2)
	m.Planned(3 * time.Second)
	m.Leading(true)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	text := rec.Body.String()
	for _, line := range []string{
		`migagent_planner_decisions_total{result="changed"} 1`,
		`migagent_planner_decisions_total{result="unservable"} 0`,
		`migagent_planner_leader 1`,
		`migagent_planner_unservable_pods 2`,
		`migagent_planner_pending_to_planned_seconds_bucket{le="5"} 1`,
		`migagent_planner_pending_to_planned_seconds_count 1`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("no %q in\n%s", line, text)
		}
	}
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v, %v", problems, err)
	}
}
