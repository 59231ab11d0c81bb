package main

import (
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/reconcile"
)

// The zero Status, reported, shows what the metrics show at start: the
// port sets every gauge at each report, so it must.
func TestMetricsPortZeroStatus(t *testing.T) {
	scrape := func(m *metrics.Metrics) string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		// The runtime's own series move between two scrapes.
		return regexp.MustCompile(`(?m)^(go|process)_.*\n`).ReplaceAllString(rec.Body.String(), "")
	}
	fresh, reported := metrics.New("test"), metrics.New("test")
	metricsPort{reported}.Report(reconcile.Status{})
	if a, b := scrape(fresh), scrape(reported); a != b {
		t.Fatalf("the zero Status changed the metrics:\n%s\nwant\n%s", b, a)
	}
}
